#!/usr/bin/env bash
# One GPU call: the FP8 recipe's first call, cold and warm, with the compile cache that now holds
# graphs with sagevideo attention; then where Open-Sora 768px's recipe step goes.
# 0. the recipe's GPU test (FP8 linears with bf16 steps under Inductor);
# 1. bench_transformer, CogVideoX-5B: eager cuDNN, compiled cuDNN, fp8-compile-sage side by side,
#    empty compile cache (so its first call is a cold process's);
# 2. fp8-compile-sage alone in a new process on that warm cache (a second worker's first call:
#    its progress line must show hits and no misses);
# 3. `sagevideo profile --model opensora-768px --recipe fp8-compile-sage` (as the API call).
# Usage (repo root, on the H200, .site.tar.xz and .tao carried; COMMIT written out: the device's
# git HEAD is stale):  bash tools/gpu_first_call_check.sh COMMIT
set -uo pipefail
source tools/gpu_env.sh "$1"
timeout 90 python3 -m pytest -q -p no:cacheprovider -m gpu tests/pipelines/test_recipe.py > $OUT/test.txt 2>&1
tail -2 $OUT/test.txt
export SAGEVIDEO_COMPILE_CACHE=/tmp/cc-model
timeout 200 python3 -m bench.bench_transformer --recipes eager-cudnn,compile-cudnn,fp8-compile-sage --repeats 2 \
  --no-layer-cosine --json $OUT/recipes.json --append-results $OUT/results.jsonl > $OUT/recipes.txt 2>&1
echo "recipes rc=$?"
timeout 80 python3 -m bench.bench_transformer --recipes fp8-compile-sage --repeats 1 --no-layer-cosine \
  --json $OUT/recipes-warm.json > $OUT/recipes-warm.txt 2>&1; echo "warm rc=$?"
export SAGEVIDEO_COMPILE_CACHE=/tmp/cc-opensora
timeout 180 python3 -c "
from sagevideo.experiments.profile import ProfileConfig, run_profile
report = run_profile(ProfileConfig(model='opensora-768px', recipe='fp8-compile-sage', json_out='$OUT/profile-opensora.json'))
print(report.table())" > $OUT/profile-opensora.txt 2>&1; echo "profile rc=$?"
grep -B2 -A6 "first call s" $OUT/recipes.txt | tail -9; grep -A3 "first call s" $OUT/recipes-warm.txt | tail -3
grep -h "compiled graphs from the cache" $OUT/recipes.txt $OUT/recipes-warm.txt | cut -c1-200
tail -20 $OUT/profile-opensora.txt | cut -c1-150
