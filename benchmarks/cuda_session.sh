#!/usr/bin/env bash
# The GPU checks of the fused kernels (linmem.ops_gpu), as one call of the device tool: the CUDA
# tests, then the benchmark; everything it prints and writes lands in $OUT (results/cuda/ after).
#
# The device machine has torch and Triton but not all of linmem's dependencies, and no data:
# carry them in .gpu/ (ignored by git), made here once:
#   mkdir -p .gpu/data && cp ../shared/data/polyphonic/{JSB_Chorales,Nottingham,MuseData}.mat .gpu/data/
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#     --platform manylinux2014_x86_64 -d .gpu/wheels optuna sqlalchemy alembic colorlog mido ...
# and call: device run --carry .gpu --timeout 590 "bash benchmarks/cuda_session.sh"
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/cuda-session}
mkdir -p "$OUT" /tmp/site
if compgen -G ".gpu/wheels/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .gpu/wheels/*.whl
fi
export PYTHONPATH=$PWD/src:/tmp/site PYTHONUNBUFFERED=1 LINMEM_TEST_DATA=$PWD/.gpu/data
{ date -Is; git rev-parse HEAD 2>/dev/null; git status --short 2>/dev/null | head;
  nvidia-smi -L; python3 -c "import torch, triton; print(torch.__version__, torch.version.cuda,
torch.backends.cudnn.version(), 'triton', triton.__version__)"; grep -m1 'model name' /proc/cpuinfo
} 2>&1 | tee "$OUT/machine.txt"
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_ops_gpu.py 2>&1 \
  | tee "$OUT/test_ops_gpu.txt"
timeout 340 python3 benchmarks/cuda_throughput.py --data-dir .gpu/data --rounds 2 \
  --tile-sweep auto 4,64,32,0 8,64,16,0 16,64,64,1 32,64,64,1 16,32,32,1 \
  --json "$OUT/fused.json" 2>&1 | tee "$OUT/fused.txt"
date -Is
