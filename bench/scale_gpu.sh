#!/usr/bin/env bash
# bench/scale.py on a GPU (written for one H200), in under 5 minutes, installing nothing but the
# wheels it is given (no index, no internet).
#
#   WHEELS=/path/to/wheels bash bench/scale_gpu.sh [out.json]
#
# WHEELS: a folder with a CUDA build of torch 2.13.0 and its nvidia-* wheels, torch-geometric
# 2.8.1, pydantic and their dependencies (pip download -d WHEELS -c constraints.txt
# torch==2.13.0 torch-geometric==2.8.1 pydantic, on a machine online, with the CUDA index).
# fedgraph itself is not installed: bench/scale.py imports it from this checkout.
# Not yet run on a GPU: written and checked on CPU only (bash -n; the same bench/scale.py
# with --device cpu).
set -euo pipefail
cd "$(dirname "$0")/.."
: "${WHEELS:?set WHEELS to a folder of wheels (see the header of this script)}"
OUT=${1:-bench/results/scale-gpu.json}
VENV=${VENV:-/tmp/fedgraph-gpu-venv}
CACHE=${CACHE:-/tmp/fedgraph-scale-cache}   # generated graphs, reused by every phase
start=$(date +%s)
if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q --no-index --find-links "$WHEELS" -c constraints.txt \
        torch torch-geometric pydantic
fi
"$VENV/bin/python" - <<'PY'
import torch
assert torch.cuda.is_available(), "torch sees no GPU (a CPU wheel, or CUDA_VISIBLE_DEVICES empty)"
print("GPU:", torch.cuda.get_device_name(0), "torch", torch.__version__, "CUDA", torch.version.cuda)
PY
echo "set-up: $(( $(date +%s) - start )) s"
# Graph generation runs on the CPU (once per size, cached); each phase then runs on the GPU.
# 1e6 nodes x 50 = 50 million directed edges; the left time bounds the whole run.
left=$(( 290 - ($(date +%s) - start) ))
timeout "$left" "$VENV/bin/python" bench/scale.py --sizes 1e4,1e5,1e6 --degree 50 \
    --phases gap-plain,gap-pma,flexprop-plain,flexprop --device cuda --cache "$CACHE" \
    --timeout 200 --out "$OUT"
echo "total: $(( $(date +%s) - start )) s; rows in $OUT"
