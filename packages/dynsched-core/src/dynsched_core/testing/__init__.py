"""Test helpers for dynsched and for third-party policy authors.

In-memory implementations of the core protocols, hypothesis strategies for valid
contexts, and the policy conformance kit. Importing this module needs hypothesis
(``pip install dynsched-core[testing]``).
"""

from __future__ import annotations

__all__: list[str] = []
