#!/usr/bin/env bash
# A shorter device call after a fix to what benchmarks/cuda_session.sh found: the kernels' CUDA
# tests, the library's CUDA tests, the throughput table without the CPU columns, then epochs at
# batch 1 and 4, in that order within one deadline (CUDA_SESSION_SECONDS). Carry .gpu/: the data
# and, in .gpu/wheels, pretty_midi, mido and importlib_resources (the image lacks them; see
# cuda_session.sh). Call: device run --carry .gpu --timeout 310 "bash benchmarks/cuda_recheck.sh"
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/cuda-session}
END=$(( $(date +%s) + ${CUDA_SESSION_SECONDS:-285} ))
left() { local s=$(( END - $(date +%s) )); (( s < $1 )) && echo $(( s > 1 ? s : 1 )) || echo "$1"; }
mkdir -p "$OUT" /tmp/site
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .gpu/wheels/*.whl
export PYTHONPATH=$PWD/src:/tmp/site PYTHONUNBUFFERED=1 LINMEM_TEST_DATA=$PWD/.gpu/data
{ date -Is; git rev-parse HEAD 2>/dev/null; git status --short 2>/dev/null | head; nvidia-smi -L
  python3 -c "import torch, triton; print(torch.__version__, torch.version.cuda,
torch.backends.cudnn.version(), 'triton', triton.__version__)"; grep -m1 'model name' /proc/cpuinfo
} 2>&1 | tee "$OUT/machine.txt"
timeout "$(left 70)" python3 -m pytest -q -p no:cacheprovider tests/test_ops_gpu.py 2>&1 \
  | tee "$OUT/test_ops_gpu.txt"
timeout "$(left 90)" python3 -m pytest -q -p no:cacheprovider tests/test_cuda.py tests/test_nn.py \
  -k "cuda or CUDA" 2>&1 | tee "$OUT/test_cuda.txt"
timeout "$(left 80)" python3 benchmarks/cuda_throughput.py --sizes 250x250 50x50 100x100 250x500 \
  --batches 4 32 128 512 --cpu-max-batch 0 --epochs --progress --json "$OUT/fused.json" 2>&1 \
  | tee "$OUT/fused.txt"
timeout "$(left 600)" python3 benchmarks/cuda_throughput.py --data-dir .gpu/data --sizes \
  --epochs nottingham musedata --epoch-batches 1 4 --cpu-frames 5000 --json "$OUT/epochs.json" \
  2>&1 | tee "$OUT/epochs.txt"
date -Is | tee -a "$OUT/machine.txt"
