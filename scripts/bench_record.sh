#!/usr/bin/env bash
# Run the published benchmarks and keep their raw JSON under docs/bench-results/.
# Needs the peers in a separate environment (docs/benchmarks.md, "How to reproduce");
# pass its python as PY. Each figure in docs/benchmarks.md names
# the file written here.
#
#   PY=.venv-bench/bin/python scripts/bench_record.sh [ROUNDS=3]
set -eu
PY=${PY:-.venv-bench/bin/python}
ROUNDS=${1:-3}
cd "$(dirname "$0")/.."
OUT=docs/bench-results
mkdir -p "$OUT"
STAMP=$(date -u +%Y%m%d-%H%M)
for threads in 2 1; do
    "$PY" -m inference.bench --backend cpu --compare --threads "$threads" --rounds "$ROUNDS" \
        > "$OUT/$STAMP-cpu-compare-${threads}t.json"
    echo "wrote $OUT/$STAMP-cpu-compare-${threads}t.json"
done
"$PY" scripts/bench_ui.py --runs 1 --out "$OUT/$STAMP-ui.json" > /dev/null
echo "wrote $OUT/$STAMP-ui.json"
