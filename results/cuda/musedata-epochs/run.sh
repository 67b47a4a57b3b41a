#!/usr/bin/env bash
# session 14, GPU call 5: what a MuseData epoch of the Table 2 configurations costs on the GPU
# (three epochs each through `linmem reseed --set device=cuda`, the study's exact settings)
cd "$(dirname "$0")/../../.."  # the repository root
export PYTHONPATH=$PWD/src:$PWD/.gpu/site PYTHONUNBUFFERED=1 LINMEM_DATA=$PWD/.gpu/data
date -Is
for spec in "lstm 750" "gru 750" "rnn 750" "lmn-b 250"; do
  set -- $spec
  timeout 100 python3 -m linmem reseed results/selected/musedata-lstm --seeds 7 --out /tmp/r-$1 \
    --set device=cuda --set epochs=3 --set model=$1 --set hidden=$2 --set memory=250 --quiet \
    --data-dir .gpu/data 2>&1 | tail -2
  cp /tmp/r-$1/s7/log.jsonl $OUT/$1-$2-log.jsonl; cp /tmp/r-$1/s7/metrics.json $OUT/$1-$2-metrics.json
  date -Is
done
