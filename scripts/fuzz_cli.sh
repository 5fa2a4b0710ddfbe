#!/usr/bin/env bash
# A longer fuzz pass over the dynsched commands (the CI pass runs 15 examples per test).
# Usage: scripts/fuzz_cli.sh [EXAMPLES]   (default 300; prints pytest's summary)
set -euo pipefail
export OMP_NUM_THREADS=1
export DYNSCHED_FUZZ_EXAMPLES="${1:-300}"
export HYPOTHESIS_PROFILE=dev  # random, not derandomized: a new draw each pass
exec hatch run test:all integration-tests/test_cli_fuzz.py -q -p no:randomly --timeout 7200
