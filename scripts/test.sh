#!/usr/bin/env bash
# The test suite (what CI runs): set up .venv if needed, then pytest. Extra args go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1
# Two pytest-xdist workers (FEDGRAPH_TEST_WORKERS; 0: one process): most of the suite's time
# is Flower runs waiting on Ray's and Flower's start-up, which overlap on CI's 2 cores.
exec .venv/bin/python -m pytest -q -n "${FEDGRAPH_TEST_WORKERS:-2}" "$@"
