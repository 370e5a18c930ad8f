#!/usr/bin/env bash
# One GPU call: the FP8 recipe's first call with Inductor's settings left alone (torchao no longer
# turns on coordinate-descent tuning), cold and warm, and the CogVideoX-5B recipe table it serves.
# 1. bench.first_call, 4 CogVideoX-5B blocks, fp8 + regional compile + sage, empty compile cache;
# 2. bench_transformer, the whole model: eager cuDNN, compiled cuDNN, fp8-compile-sage side by
#    side, another empty cache (so its first call is a cold process's);
# 3. fp8-compile-sage alone in a new process on that warm cache (a second worker's first call);
# first, the recipe's GPU test (FP8 linears with bf16 steps under Inductor).
# Usage (repo root, on the H200, .site.tar.xz and .tao carried; COMMIT written out: the device's
# git HEAD is stale):  bash tools/gpu_first_call_check.sh COMMIT
set -uo pipefail
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 BENCH_COMMIT=$1
[ -d /tmp/site ] || tar xJf .site.tar.xz -C /tmp
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .tao/*.whl 2>&1 | tail -1
timeout 90 python3 -m pytest -q -p no:cacheprovider -m gpu tests/pipelines/test_recipe.py 2>&1 | tail -2  # fp8 + bf16 steps
SAGEVIDEO_COMPILE_CACHE=/tmp/cc-blocks timeout 140 python3 -m bench.first_call --layers 4 --linear fp8 \
  --out $OUT/first-call > $OUT/first-call.txt 2>&1; echo "first_call rc=$?"
export SAGEVIDEO_COMPILE_CACHE=/tmp/cc-model
timeout 250 python3 -m bench.bench_transformer --recipes eager-cudnn,compile-cudnn,fp8-compile-sage --repeats 2 \
  --no-layer-cosine --json $OUT/recipes.json --append-results $OUT/results.jsonl > $OUT/recipes.txt 2>&1
echo "recipes rc=$?"
timeout 90 python3 -m bench.bench_transformer --recipes fp8-compile-sage --repeats 1 --no-layer-cosine \
  --json $OUT/recipes-warm.json > $OUT/recipes-warm.txt 2>&1; echo "warm rc=$?"
grep -E "^block call|first call|graphs" $OUT/first-call.txt | tail -8
grep -B2 -A6 "first call s" $OUT/recipes.txt | tail -9; grep -A3 "first call s" $OUT/recipes-warm.txt | tail -3
grep -h "compiled graphs from the cache" $OUT/recipes.txt $OUT/recipes-warm.txt   # the warm one: hits, no misses
