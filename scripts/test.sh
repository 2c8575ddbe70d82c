#!/usr/bin/env bash
# The test suite (what CI runs): set up .venv if needed, then pytest. Extra args go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1
exec .venv/bin/python -m pytest -q "$@"
