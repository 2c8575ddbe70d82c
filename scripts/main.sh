#!/usr/bin/env bash
# The main job: PPGNN on the bundled Cora, 10 clients, levels {1, 2, 4}, with `flwr run .`.
# Extra arguments go to `flwr run` (e.g. --run-config "budgets='1,2' epochs=50").
# `flwr run` exits 0 even when a run fails, so this script checks the report it wrote.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"
export FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1   # offline: no `uv sync` of the app
# `flwr run` reuses any SuperLink on 127.0.0.1:39091, with the environment (and code) it was
# started with. Refuse one started from another checkout or venv.
if pids=$(pgrep -f flower-superlink); then
  for pid in $pids; do
    if ! tr '\0' ' ' < /proc/$pid/cmdline | grep -q "$PWD/.venv/"; then
      echo "A SuperLink from another environment is running (pid $pid):" >&2
      tr '\0' ' ' < /proc/$pid/cmdline >&2; echo >&2
      echo "flwr run would use it and that environment's code. Stop it: kill $pid" >&2
      exit 1
    fi
  done
fi
OUT="$PWD/outputs"
RUN="main-$(date +%Y%m%d-%H%M%S)"
flwr run . --stream \
  --federation-config "num-supernodes=10 client-resources-num-cpus=1" \
  --run-config "output-dir='$OUT' run-name='$RUN'" "$@"
python - "$OUT/$RUN.json" <<'PY'
import json, sys
path = sys.argv[1]
try:
    report = json.load(open(path))
except FileNotFoundError:
    sys.exit(f"FAILED: no report at {path} (see the log above)")
if report["status"] != "ok":
    sys.exit(f"FAILED: {report['error']}")
print(f"ok: test accuracy {report['accuracy']['test']:.4f}; report {path}")
PY
