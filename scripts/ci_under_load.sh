#!/usr/bin/env bash
# Run the CI (or a pytest selection) with a CPU hog beside it: two busy processes, one per
# core of a 2-core CI machine, as when other work loads the machine. The tests must not
# race the clock, so this must pass as `.ci/run` does on an idle machine.
#
# Usage:
#   scripts/ci_under_load.sh                      # the whole CI: bash .ci/run
#   scripts/ci_under_load.sh PYTEST-ARGS...       # hatch run test:python -m pytest PYTEST-ARGS...
#   HOGS=4 scripts/ci_under_load.sh ...           # another number of busy processes
#
# The busy processes are killed at the end (also on failure or Ctrl-C); the exit status
# is the run's.
set -uo pipefail
cd "$(dirname "$0")/.."

HOGS="${HOGS:-2}"
export OMP_NUM_THREADS=1
pids=()

stop_hogs() {
    for pid in "${pids[@]}"; do
        kill "$pid" 2>/dev/null || true
    done
    for pid in "${pids[@]}"; do
        wait "$pid" 2>/dev/null || true
    done
    pids=()
}
trap stop_hogs EXIT
trap 'stop_hogs; exit 130' INT
trap 'stop_hogs; exit 143' TERM

for _ in $(seq "$HOGS"); do
    python3 -c 'while True: pass' &
    pids+=("$!")
done
echo "ci_under_load: ${HOGS} busy process(es) running (pids ${pids[*]})" >&2

start=$(date +%s)
if [ "$#" -eq 0 ]; then
    bash .ci/run
else
    hatch run test:python -m pytest "$@"
fi
status=$?
echo "ci_under_load: exit ${status} after $(($(date +%s) - start)) s with ${HOGS} busy process(es);" \
    "load average: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
exit "$status"
