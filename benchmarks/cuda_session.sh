#!/usr/bin/env bash
# The GPU checks of the fused kernels (linmem.ops.gpu), as one call of the device tool, in order
# of importance within one deadline (CUDA_SESSION_SECONDS; the session's device time allows one
# or two calls). `full` (the default): the CUDA tests of the kernels, the benchmark, a sweep of
# the kernels' tilings at LMN-B(250, 250), then the CUDA tests of the whole library. `recheck`,
# a shorter call after a fix: the kernels' and the library's CUDA tests, the throughput table
# without the CPU columns, then epochs at batch 1 and 4. Everything printed and written lands in
# $OUT (results/cuda/).
#
# The device machine has torch, Triton and tqdm but not pretty_midi (the CLI imports it) and no
# data: carry them in .gpu/ (ignored by git), made here once:
#   mkdir -p .gpu/data && cp ../shared/data/polyphonic/{JSB_Chorales,Nottingham,MuseData}.mat .gpu/data/
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 -d .gpu/wheels \
#     pretty_midi==0.2.11.post0 mido==1.3.3 importlib_resources
# and call: device run --carry .gpu --timeout 580 "bash benchmarks/cuda_session.sh"
# (recheck: --timeout 310 "bash benchmarks/cuda_session.sh recheck")
#
# `batch1`: batch 1 on the device machine's CPU, not its GPU (its CPU has AVX-512 where this
# project's machines may not): LMN-B(250, 250) at batch 1, 4 and 32 through each kernel variant
# the CPU runs (benchmarks/throughput.py, one thread, a MuseData epoch), then the same training
# step and inference under the kernel before the batch-1 work (147caa0) and now, interleaved
# (benchmarks/ab_trees.py). The old tree is carried too, made here once:
#   mkdir -p .gpu/before && git archive 147caa0 src | tar -x -C .gpu/before
#   git rev-parse 147caa0 > .gpu/before/COMMIT
# and call: device run --carry .gpu --timeout 580 "bash benchmarks/cuda_session.sh batch1"
set -uo pipefail
cd "$(dirname "$0")/.."
MODE=${1:-full}
OUT=${OUT:-/tmp/cuda-session}
SECONDS_DEFAULT=$([ "$MODE" = recheck ] && echo 285 || echo 555)
END=$(( $(date +%s) + ${CUDA_SESSION_SECONDS:-$SECONDS_DEFAULT} ))
left() { local s=$(( END - $(date +%s) )); (( s < $1 )) && echo $(( s > 1 ? s : 1 )) || echo "$1"; }
mkdir -p "$OUT" /tmp/site
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .gpu/wheels/*.whl
export PYTHONPATH=$PWD/src:/tmp/site PYTHONUNBUFFERED=1 LINMEM_TEST_DATA=$PWD/.gpu/data
{ date -Is; git rev-parse HEAD 2>/dev/null; git status --short 2>/dev/null | head;
  nvidia-smi -L; python3 -c "import torch, triton; print(torch.__version__, torch.version.cuda,
torch.backends.cudnn.version(), 'triton', triton.__version__)"; grep -m1 'model name' /proc/cpuinfo
  nproc; grep -o -m1 avx512f /proc/cpuinfo
} 2>&1 | tee "$OUT/machine.txt"
kernel_tests() {
  timeout "$(left "$1")" python3 -m pytest -q -p no:cacheprovider tests/test_ops_gpu.py 2>&1 \
    | tee "$OUT/test_ops_gpu.txt"
}
library_tests() {
  timeout "$(left "$1")" python3 -m pytest -q -p no:cacheprovider tests/test_cuda.py \
    tests/test_nn.py -k "cuda or CUDA" 2>&1 | tee "$OUT/test_cuda.txt"
}
if [ "$MODE" = batch1 ]; then
  variants="avx2"; grep -q avx512f /proc/cpuinfo && variants="avx512 avx2"
  for v in $variants; do
    OMP_NUM_THREADS=1 LINMEM_CPU_KERNEL=$v timeout "$(left 200)" python3 benchmarks/throughput.py \
      --sizes 250x250 --batches 1 4 32 --rounds 2 --epochs musedata --data-dir .gpu/data \
      --json "$OUT/batch1-$v.json" 2>&1 | tee "$OUT/batch1-$v.txt"
  done
  for v in $variants; do
    OMP_NUM_THREADS=1 LINMEM_CPU_KERNEL=$v timeout "$(left 100)" python3 benchmarks/ab_trees.py \
      --trees .gpu/before . --sizes 250x250 --batch 1 --rounds 3 \
      --json "$OUT/ab_batch1-$v.json" 2>&1 | tee "$OUT/ab_batch1-$v.txt"
  done
elif [ "$MODE" = recheck ]; then
  kernel_tests 70
  library_tests 90
  timeout "$(left 80)" python3 benchmarks/cuda_throughput.py --sizes 250x250 50x50 100x100 \
    250x500 --batches 4 32 128 512 --cpu-max-batch 0 --epochs --progress \
    --json "$OUT/fused.json" 2>&1 | tee "$OUT/fused.txt"
  timeout "$(left 600)" python3 benchmarks/cuda_throughput.py --data-dir .gpu/data --sizes \
    --epochs nottingham musedata --epoch-batches 1 4 --cpu-frames 5000 \
    --json "$OUT/epochs.json" 2>&1 | tee "$OUT/epochs.txt"
else
  kernel_tests 150
  timeout "$(left 290)" python3 benchmarks/cuda_throughput.py --data-dir .gpu/data --rounds 2 \
    --json "$OUT/fused.json" 2>&1 | tee "$OUT/fused.txt"
  timeout "$(left 70)" python3 benchmarks/cuda_throughput.py --sizes 250x250 --batches 4 32 \
    128 512 --rounds 2 --epochs --progress --tiles-only --tile-sweep auto 4,64,32,0 \
    1,64,128,0,8 1,128,64,0,8 1,256,32,0,8 1,64,256,0,16 4,64,128,0,8 16,64,64,1,8 \
    --json "$OUT/tiles.json" 2>&1 \
    | tee "$OUT/tiles.txt"
  library_tests 600
fi
date -Is | tee -a "$OUT/machine.txt"
