#!/usr/bin/env bash
# The main job beside CPU-bound load (issue 61): `bash scripts/main.sh` while N processes
# (default 6, LOAD_PROCS) spin on the CPU, as on the 2-core machine, load 6-7, where the
# SuperLink marked the run failed ("No heartbeat received from the task", 60.0 s after it
# started). Each spinner is bounded in time (LOAD_MAX_S, default 900 s) and all are killed
# when this script exits. Extra arguments go to scripts/main.sh. Prints the exit code, wall
# time, load average, the script's last lines and the report's task_heartbeats (what the
# task's second heartbeat sender saw: the longest gap between two acknowledged heartbeats).
# Fresh Flower home and data cache each time (main.sh picks its own ports and home).
set -uo pipefail
cd "$(dirname "$0")/.."
N=${LOAD_PROCS:-6}
MAX=${LOAD_MAX_S:-900}
spinners=()
cleanup() { [ ${#spinners[@]} -eq 0 ] || kill "${spinners[@]}" 2>/dev/null; rm -rf "$cache"; }
cache=$(mktemp -d "${TMPDIR:-/tmp}/fedgraph-load-cache.XXXXXX")
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
for _ in $(seq "$N"); do
  timeout "$MAX" python3 -c 'while True: pass' &
  spinners+=($!)
done
log=$(mktemp)
start=$SECONDS
XDG_CACHE_HOME="$cache" bash scripts/main.sh "$@" > "$log" 2>&1
code=$?
wall=$((SECONDS - start))
echo "main_under_load: $N spinners, exit $code, wall ${wall} s, load $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) cores"
grep -E '^(ok:|FAILED|note:|Flower.s status|  the SuperLink|SuperLink:)' "$log"
report=$(sed -n 's/^ok: .*; report \(.*\.json\)$/\1/p; s/^FAILED: .*; report \(.*\.json\)$/\1/p' "$log" | tail -1)
if [ -n "$report" ] && [ -f "$report" ]; then
  .venv/bin/python -c 'import json, sys; r = json.load(open(sys.argv[1])); print("task_heartbeats:", r.get("host", {}).get("task_heartbeats")); print("timings_s:", r.get("timings_s"))' "$report"
fi
rm -f "$log"
exit "$code"
