#!/usr/bin/env bash
# One GPU call for issue 21: one whole CogVideoX-5B video per arm (bench/bench_video.py), stock
# diffusers against sagevideo's recipe, decode included; the compile cache starts empty.
# Usage (repo root, on the GPU machine, .site.tar.xz and .tao/torchao-*.whl carried; COMMIT is this
# checkout's `git rev-parse HEAD` written out: on the device, git's HEAD is stale):
#   bash tools/gpu_video_check.sh COMMIT [LIMIT_S] [ARMS]
set -uo pipefail
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 BENCH_COMMIT=$1
export SAGEVIDEO_COMPILE_CACHE=/tmp/sagevideo-compile TORCH_LOGS=recompiles
[ -d /tmp/site ] || tar xJf .site.tar.xz -C /tmp
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .tao/*.whl 2>&1 | tail -1
timeout "${2:-560}" python3 -m bench.bench_video --work /tmp/bench-video --arms "${3:-sage,stock,second-worker,sage-cache}" \
  --json $OUT/video.json --append-results $OUT/results.jsonl > $OUT/video.txt 2>&1; echo "video rc=$?"
echo "recompile lines: $(grep -c 'Recompiling function' $OUT/video.txt)"
grep 'bench_video:' $OUT/video.txt | tail -8; tail -12 $OUT/video.txt
