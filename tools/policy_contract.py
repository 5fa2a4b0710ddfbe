"""Show or record the dynsched policy contract (hooks and context fields) and its version.

The contract is read from the code (`DynamicSchedulePolicyBase`, `DynamicScheduleContext`)
and compared to ``packages/dynsched-core/src/dynsched_core/policy_contract.json``::

    hatch run python tools/policy_contract.py            # show the differences, exit 1 if any
    hatch run python tools/policy_contract.py record     # record the code's contract
    hatch run python tools/policy_contract.py record --bump major --change "..."

``record`` bumps the policy API version by the rule (major: a hook or field removed or
changed, a required one added; minor: an optional one added) and appends a history line
with the dynsched-core version that ships it, which must be newer than the last recorded
one (bump dynsched-core first). ``--bump`` forces a bump the signatures do not show (a
hook whose meaning changed). The rule: the root README, section "Releasing".
"""

from __future__ import annotations

import argparse
import json
import sys
import tomllib
from pathlib import Path

from dynsched_core import _contract

ROOT = Path(__file__).resolve().parents[1]
CORE_PYPROJECT = ROOT / "packages" / "dynsched-core" / "pyproject.toml"


def _core_version() -> str:
    with CORE_PYPROJECT.open("rb") as fh:
        return str(tomllib.load(fh)["project"]["version"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("action", nargs="?", choices=["check", "record"], default="check")
    parser.add_argument("--bump", choices=["major", "minor"], help="force this bump")
    parser.add_argument("--change", help="one line for the history (default: the changes)")
    args = parser.parse_args(argv)

    record = _contract.load_recorded_contract()
    contract = _contract.derive_policy_contract()
    if args.action == "check":
        message = _contract.explain_contract_change(record, contract)
        if message:
            print(message)
            return 1
        print(f"policy API {record['version']}: the code matches the recorded contract")
        return 0
    try:
        new = _contract.updated_record(
            record, contract, _core_version(), bump=args.bump, change=args.change
        )
    except ValueError as exc:
        print(f"policy_contract.py: {exc}", file=sys.stderr)
        return 2
    Path(_contract.CONTRACT_FILE).write_text(json.dumps(new, indent=2) + "\n", encoding="utf-8")
    print(f"recorded policy API {new['version']}: {new['history'][-1]['change']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
