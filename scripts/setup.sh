#!/usr/bin/env bash
# Create .venv (if missing) and install fedgraph with the tested pins. Idempotent; offline-safe
# where the package registry is reachable. PYTHON selects the interpreter (3.11 or 3.12).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
if ! .venv/bin/python -c "import fedgraph, flwr, torch_geometric, matplotlib, xdist" 2>/dev/null; then
  .venv/bin/python -m pip install -q -U pip
  # torch first, pinned: an unpinned torch would pull a multi-GB CUDA build.
  .venv/bin/python -m pip install -q "torch==2.13.0"
  .venv/bin/python -m pip install -q -c constraints.txt -e ".[test]"
fi
