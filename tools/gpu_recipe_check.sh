#!/usr/bin/env bash
# One GPU call for issue 21: the interception under Inductor, the recipe table (CogVideoX-5B) and a profile.
# Usage (repo root, on the GPU machine, .site.tar.xz and .tao/torchao-*.whl carried): bash tools/gpu_recipe_check.sh COMMIT
set -uo pipefail
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 BENCH_COMMIT=$1
[ -d /tmp/site ] || tar xJf .site.tar.xz -C /tmp
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .tao/*.whl 2>&1 | tail -1
python3 -c "import torchao; print('torchao', torchao.__version__)" 2>&1 | tail -1
timeout 290 python3 -m bench.bench_transformer --recipes default --json $OUT/recipes-cogvideox.json --append-results $OUT/results.jsonl > $OUT/recipes-cogvideox.txt 2>&1; echo "recipes rc=$?"
timeout 45 python3 -m sagevideo profile --model cogvideox-5b --json $OUT/profile-cogvideox-5b.json > $OUT/profile.txt 2>&1; echo "profile rc=$?"; tail -8 $OUT/profile.txt
timeout 60 python3 -m pytest -q -p no:cacheprovider -m gpu tests/pipelines/test_intercept.py 2>&1 | tail -2
tail -9 $OUT/recipes-cogvideox.txt
