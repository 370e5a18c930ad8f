#!/usr/bin/env bash
# One GPU call for issue 21: the recipe table (CogVideoX-5B forward, compile cache empty), where
# the compile time goes (dynamo's compile_times), the interception under Inductor, and
# `sagevideo bench attention` at the model's own shapes.
# Usage (repo root, on the GPU machine, .site.tar.xz and .tao/torchao-*.whl carried; COMMIT is this
# checkout's `git rev-parse HEAD` written out: on the device, git's HEAD is stale):
#   bash tools/gpu_recipe_check.sh COMMIT [RECIPES_LIMIT_S]
set -uo pipefail
source tools/gpu_env.sh "$1"
export SAGEVIDEO_COMPILE_CACHE=/tmp/sagevideo-compile
timeout "${2:-420}" python3 - $OUT > $OUT/recipes-cogvideox.txt 2>&1 <<'PY'
import runpy, sys, torch
out = sys.argv[1]
sys.argv = ["bench_transformer", "--recipes", "default", "--repeats", "2", "--no-layer-cosine",
            "--json", f"{out}/recipes-cogvideox.json", "--append-results", f"{out}/results.jsonl"]
try:
    runpy.run_module("bench.bench_transformer", run_name="__main__")
except SystemExit:
    pass
finally:
    print(torch._dynamo.utils.compile_times(repr="str", aggregate=True))
PY
echo "recipes rc=$?"
timeout 60 python3 -m pytest -q -p no:cacheprovider -m gpu tests/pipelines/test_intercept.py 2>&1 | tail -2
timeout 50 python3 -m sagevideo bench attention --model cogvideox-5b --reps 2 --json $OUT/attention-cogvideox.json \
  > $OUT/attention.txt 2>&1; echo "bench attention rc=$?"; tail -8 $OUT/attention.txt
grep -A12 "^cogvideox\|on NVIDIA" $OUT/recipes-cogvideox.txt | tail -14; grep -i "compile\|inductor" $OUT/recipes-cogvideox.txt | tail -12
