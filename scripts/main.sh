#!/usr/bin/env bash
# The main job: PPGNN on the bundled Cora, 10 clients, levels {1, 2, 4}, with `flwr run .`.
# Extra arguments go to `flwr run` (e.g. --run-config "budgets='1,2' epochs=50").
# `flwr run` exits 0 even when a run fails, so this script checks the report it wrote.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"
export FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1   # offline: no `uv sync` of the app
FEDERATION="num-supernodes=10 client-resources-num-cpus=1"
# Flower refuses an unknown --run-config key naming no key, and a bad value fails only after
# its SuperLink and Ray started: check the run config first, as `fedgraph run` does (exit 2).
python -m fedgraph.simulations.flwr_precheck --federation-config "$FEDERATION" "$@"
# `flwr run` reuses the SuperLink whose Control API is on 127.0.0.1:$FLWR_LOCAL_CONTROL_API_PORT
# (default 39093), with the environment (and code) it was started with. Refuse that one when it
# was started from another checkout or venv; SuperLinks on other ports are not ours to judge.
CONTROL="127.0.0.1:${FLWR_LOCAL_CONTROL_API_PORT:-39093}"
if pids=$(pgrep -f flower-superlink); then
  for pid in $pids; do
    cmd=$(tr '\0' ' ' < /proc/$pid/cmdline 2>/dev/null) || continue
    case "$cmd" in *"--control-api-address $CONTROL "*) ;; *) continue ;; esac
    if ! grep -q "$PWD/.venv/" <<< "$cmd"; then
      echo "A SuperLink from another environment is running on $CONTROL (pid $pid):" >&2
      echo "$cmd" >&2
      echo "flwr run would use it and that environment's code. Stop it (kill $pid), or run" >&2
      echo "beside it on ports of your own: FLWR_HOME=\$HOME/.flwr-2" >&2
      echo "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT=39191 FLWR_LOCAL_CONTROL_API_PORT=39193 bash scripts/main.sh" >&2
      exit 1
    fi
  done
fi
# The SuperLink `flwr run` starts for this job is stopped when the job ends (one that was
# already running, this environment's, is left as it was).
superlinks() { pgrep -f "flower-superlink.*--control-api-address $CONTROL " || true; }
already=$(superlinks)
descendants() {  # every process below $1, each parent before its children
  local child
  for child in $(pgrep -P "$1" 2>/dev/null); do echo "$child"; descendants "$child"; done
}
# The SuperExec and the simulation reach the SuperLink on its --port (the runtime API): found
# by that address too, since a SuperExec that ends first leaves its simulation to init.
RUNTIME="127.0.0.1:${FLWR_LOCAL_SUPERLINK_HTTP_API_PORT:-39091}"
stop_superlink() {
  [ -z "$already" ] || return 0
  for pid in $(superlinks) $(pgrep -f -- "--runtime-api-address $RUNTIME " || true); do
    tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null | grep -q "$PWD/.venv/" || continue
    # its SuperExec, the simulation and the simulation's Ray processes, then itself
    kill -TERM $(descendants "$pid") "$pid" 2>/dev/null || true
  done
}
OUT="$PWD/outputs"
RUN="main-$(date +%Y%m%d-%H%M%S)"
LOG=$(mktemp)
trap 'stop_superlink; rm -f "$LOG"' EXIT
# Ctrl-C ends only `flwr run`'s log stream: the run goes on in the SuperLink (and wrote its
# report after this script had said there was none). Stop it, say so, and exit 128 + the
# signal's number ($1): 130 for Ctrl-C (INT), 143 for TERM, as `fedgraph run` does.
interrupted() {
  trap - INT TERM
  local id
  [ -z "$pipeline" ] || kill -TERM $(descendants "$pipeline") "$pipeline" 2>/dev/null || true
  id=$(grep -oE 'Successfully started run [0-9]+' "$LOG" | grep -oE '[0-9]+$' | head -1)
  [ -z "$id" ] || flwr stop "$id" >/dev/null 2>&1 || true  # the SuperLink this run is on
  stop_superlink
  echo "interrupted: the run was stopped${id:+ (run $id)}; no complete report at $OUT/$RUN.json (at most one with status interrupted)" >&2
  exit "$1"
}
pipeline=""  # the background `flwr run` and its log stream (below)
trap 'interrupted 130' INT
trap 'interrupted 143' TERM
# In the background, waited for: bash runs a trap only once its foreground command returns,
# so a SIGTERM sent to this script alone (kill, a scheduler) would wait for the whole run;
# `wait` returns at once on a trapped signal. (A background job ignores SIGINT: a terminal's
# Ctrl-C reaches only this script, whose trap stops the run.)
( flwr run . --stream \
    --federation-config "$FEDERATION" \
    --run-config "output-dir='$OUT' run-name='$RUN'" "$@" 2>&1 | tee -i "$LOG" ) &
pipeline=$!
wait "$pipeline"
# The report the run wrote, from its own last line ("report: <path>"): a --run-config of the
# user's may name another output-dir or run-name than the ones above.
REPORT=$(sed -n 's/^report: \(.*\.json\)$/\1/p' "$LOG" | tail -1)
python - "$REPORT" <<'PY'
import json, sys
path = sys.argv[1]
if not path:  # the run prints "report: <path>" whenever it writes one
    sys.exit("FAILED: the run wrote no report (see the log above)")
try:
    report = json.load(open(path))
except FileNotFoundError:
    sys.exit(f"FAILED: no report at {path} (see the log above)")
if report["status"] != "ok":
    sys.exit(f"FAILED: {report['error']}; report {path}")
print(f"ok: test accuracy {report['accuracy']['test']:.4f}; report {path}")
PY
