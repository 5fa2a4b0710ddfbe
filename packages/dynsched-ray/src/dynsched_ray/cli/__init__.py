"""The ``dynsched run`` and ``dynsched train`` sub-commands and their one config loader.

`run` and `train` register through the ``dynsched.cli`` entry-point group; both read
their YAML config (verl layout), ``--set`` overrides and local-capacity checks through
`config` (`load_verl_config`). Importing this package imports neither command.
"""

from __future__ import annotations

__all__: list[str] = []
