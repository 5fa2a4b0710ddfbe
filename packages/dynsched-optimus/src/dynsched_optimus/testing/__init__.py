"""Test oracles of dynsched-optimus: straightforward versions of the fast algorithms.

:func:`place_reference` re-sorts every server for every job (``O(J N log N)``); it is the
executable specification of :func:`dynsched_optimus.place`, which the property tests and
the placement benchmark compare against.  Not for production use.
"""

from __future__ import annotations

from dynsched_optimus.testing._placement_oracle import place_reference

__all__ = ["place_reference"]
