#!/usr/bin/env bash
# The suite must pass on a busy machine: clone the repository into an empty folder, start
# SPINNERS CPU-bound processes beside it (`python3 -c "while True: pass"`), and run
# `make test` RUNS times in a row. Prints each run's result and time; the spinners stop
# when the script ends, however it ends.
#
#   scripts/suite_under_load.sh [RUNS=3] [SPINNERS=2] [REPO]
set -u
RUNS=${1:-3}
SPINNERS=${2:-2}
REPO=${3:-$(git -C "$(dirname "$0")/.." rev-parse --show-toplevel)}
WORK=$(mktemp -d -t inferdesk-load.XXXXXX)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done; }
trap cleanup EXIT INT TERM

echo "suite under load, $(date -u '+%Y-%m-%d %H:%M UTC'); cpu: $(grep -m1 'model name' \
/proc/cpuinfo | cut -d: -f2- | sed 's/^ //') ($(nproc) cores); repo: $(basename "$REPO") @ \
$(git -C "$REPO" rev-parse --short HEAD); $SPINNERS spinners"
git clone -q "$REPO" "$WORK/inferdesk" || exit 1
cd "$WORK/inferdesk" || exit 1
for _ in $(seq 1 "$SPINNERS"); do
    python3 -c "while True: pass" &
    PIDS+=($!)
done
failed=0
for run in $(seq 1 "$RUNS"); do
    t0=$SECONDS
    make test >"$WORK/run$run.log" 2>&1
    rc=$?
    [ $rc -eq 0 ] || failed=1
    echo "run $run: exit $rc in $((SECONDS - t0)) s, load $(cut -d' ' -f1 /proc/loadavg):" \
        "$(grep -E '[0-9]+ (passed|failed)' "$WORK/run$run.log" | tail -n 1)"
    grep -E '^FAILED' "$WORK/run$run.log" | sed 's/^/    /'
done
echo "logs: $WORK"
exit $failed
