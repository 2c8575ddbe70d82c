#!/usr/bin/env bash
# The main job: PPGNN on the bundled Cora, 10 clients, levels {1, 2, 4}, with `flwr run .`.
# Extra arguments go to `flwr run` (e.g. --run-config "budgets='1,2' epochs=50").
# `flwr run` exits 0 even when a run fails, so this script checks the report it wrote and
# Flower's status of the run. It runs on a SuperLink of its own (free ports, its own
# FLWR_HOME) unless FLWR_HOME or FLWR_LOCAL_{SUPERLINK_HTTP_API,CONTROL_API}_PORT are set.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"
export FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1   # offline: no `uv sync` of the app
# The simulated clients' identity keys for authenticated secure aggregation, provisioned by
# this launcher, never by the server (fedgraph.identity; a deployment provisions each node)
if [ -z "${FEDGRAPH_IDENTITY_SECRET:-}" ]; then
  FEDGRAPH_IDENTITY_SECRET=$(python -c 'import os; print(os.urandom(32).hex())')
  export FEDGRAPH_IDENTITY_SECRET
fi
FEDERATION="num-supernodes=10 client-resources-num-cpus=1"
# Flower refuses an unknown --run-config key naming no key, and a bad value fails only after
# its SuperLink and Ray started: check the run config first, as `fedgraph run` does (exit 2).
python -m fedgraph.simulations.flwr_precheck --federation-config "$FEDERATION" "$@"
# `flwr run` starts (or reuses) a local SuperLink on 127.0.0.1:39091 and :39093 (Control API),
# state under $FLWR_HOME (~/.flwr): two apps on one machine would meet there. Unless the user
# gives them, this job takes ports free now and a Flower home of its own (removed at the end
# when the run ended ok), and starts that SuperLink itself: Flower waits only 15 s for one to
# answer, which a loaded machine exceeded.
own_home=""
if [ -z "${FLWR_HOME:-}" ]; then
  own_home=$(mktemp -d "${TMPDIR:-/tmp}/fedgraph-flwr.XXXXXX")
  export FLWR_HOME="$own_home"
fi
user_ports=0
if [ -n "${FLWR_LOCAL_SUPERLINK_HTTP_API_PORT:-}${FLWR_LOCAL_CONTROL_API_PORT:-}" ]; then
  user_ports=1
fi
pick_ports() {
  [ "$user_ports" = 1 ] && return 0
  local ports
  ports=$(python -m fedgraph.simulations.local_superlink ports)
  export FLWR_LOCAL_SUPERLINK_HTTP_API_PORT=${ports% *} FLWR_LOCAL_CONTROL_API_PORT=${ports#* }
}
pick_ports
CONTROL="127.0.0.1:${FLWR_LOCAL_CONTROL_API_PORT:-39093}"
RUNTIME="127.0.0.1:${FLWR_LOCAL_SUPERLINK_HTTP_API_PORT:-39091}"
# On ports the user gave, a SuperLink may already run: `flwr run` would use it, with the
# environment (and code) it was started with. Refuse one started from another checkout or
# venv; one of this environment is used and left running.
already=""
if [ "$user_ports" = 1 ] && pids=$(pgrep -f flower-superlink); then
  for pid in $pids; do
    cmd=$(tr '\0' ' ' 2>/dev/null < /proc/$pid/cmdline) || continue
    case "$cmd" in *"--control-api-address $CONTROL "*) ;; *) continue ;; esac
    if ! grep -q "$PWD/.venv/" <<< "$cmd"; then
      echo "A SuperLink from another environment is running on $CONTROL (pid $pid):" >&2
      echo "$cmd" >&2
      echo "flwr run would use it and that environment's code. Stop it (kill $pid), or leave" >&2
      echo "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT and FLWR_LOCAL_CONTROL_API_PORT unset: this" >&2
      echo "script then takes free ports of its own." >&2
      exit 1
    fi
    already=$pid
  done
fi
descendants() {  # every process below $1, each parent before its children
  local child
  for child in $(pgrep -P "$1" 2>/dev/null); do echo "$child"; descendants "$child"; done
}
superlink=""  # the SuperLink this job started (stopped at its end)
# The SuperExec and the simulation reach the SuperLink on its --port (the runtime API): found
# by that address too, since a SuperExec that ends first leaves its simulation to init.
# Swept again for a few seconds: a SuperExec stopped while it launched the run's simulation
# left that simulation running (seen once, Ctrl-C 3 s after the run started); SIGKILL last.
stop_superlink() {
  [ -n "$superlink" ] || return 0
  local round pid pids sig
  for round in 1 2 3 4 5 6; do
    pids=""
    for pid in $superlink $(pgrep -f -- "--runtime-api-address $RUNTIME " || true); do
      tr '\0' ' ' 2>/dev/null < "/proc/$pid/cmdline" | grep -q "$PWD/.venv/" || continue
      # its SuperExec, the simulation and the simulation's Ray processes, then itself
      pids="$pids $(descendants "$pid") $pid"
    done
    [ -n "${pids// /}" ] || { [ "$round" -gt 2 ] && return 0; sleep 1; continue; }
    sig=TERM; [ "$round" -lt 5 ] || sig=KILL
    kill -"$sig" $pids 2>/dev/null || true
    sleep 1
  done
}
start_superlink() {  # the command `flwr run` would run (flwr/cli/local_superlink.py)
  local dir="$FLWR_HOME/local-superlink" try deadline
  mkdir -p "$dir"
  for try in 1 2 3; do
    setsid flower-superlink --insecure --simulation --isolation subprocess \
      --control-api-address "$CONTROL" --host 127.0.0.1 \
      --port "${RUNTIME#127.0.0.1:}" --log-file "$dir/superlink.log" \
      --log-rotation-interval-hours 24 --log-rotation-backup-count 7 \
      --database "$dir/state.db" < /dev/null > /dev/null 2>&1 &
    superlink=$!
    deadline=$((SECONDS + ${FEDGRAPH_SUPERLINK_START_S:-180}))
    while kill -0 "$superlink" 2>/dev/null && [ $SECONDS -lt $deadline ]; do
      if python -c "import sys, httpx; sys.exit(not httpx.get('http://$RUNTIME/health', timeout=2).is_success)" 2>/dev/null; then
        return 0
      fi
      sleep 1
    done
    stop_superlink
    superlink=""
    # a port taken meanwhile (the SuperLink exits): new ones, unless the user gave them
    [ "$user_ports" = 0 ] || break
    pick_ports
    CONTROL="127.0.0.1:$FLWR_LOCAL_CONTROL_API_PORT"
    RUNTIME="127.0.0.1:$FLWR_LOCAL_SUPERLINK_HTTP_API_PORT"
  done
  echo "FAILED: no SuperLink answered on $RUNTIME (log: $dir/superlink.log)" >&2
  exit 1
}
LOG=$(mktemp)
status=1
finish() {  # the SuperLink this job started, and its Flower home unless the run failed
  stop_superlink
  rm -f "$LOG"
  if [ -n "$own_home" ]; then
    if [ "$status" = 0 ]; then rm -rf "$own_home"
    else echo "Flower's state and SuperLink log kept in $own_home/local-superlink" >&2; fi
  fi
}
trap finish EXIT
trap 'exit 130' INT  # until the run starts (below: the run is stopped too)
trap 'exit 143' TERM
[ -n "$already" ] || start_superlink
echo "SuperLink: $RUNTIME (Control API $CONTROL), FLWR_HOME=$FLWR_HOME"
OUT="$PWD/outputs"
RUN="main-$(date +%Y%m%d-%H%M%S)"
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
wait "$pipeline" || true  # flwr run's own exit code says nothing of the run: read below
# What really happened: the report the run wrote (its last line "report: <path>": a
# --run-config of the user's may name another output-dir or run-name) and the SuperLink's
# status of the run with Flower's reason; a run process still going (its log stream ended
# when the SuperLink stopped waiting for it) is waited for. An ok report is an ok run.
python -m fedgraph.simulations.local_superlink verdict --log "$LOG" \
  --expected "$OUT/$RUN.json" --runtime-address "$RUNTIME" &
pipeline=$!
wait "$pipeline" && status=0 || status=$?
exit "$status"
