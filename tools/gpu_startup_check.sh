#!/usr/bin/env bash
# One GPU call for issue 21: where a second worker's start-up goes, and what coordinate-descent
# tuning costs and gives.
# 1. bench_video sage (fills the compile cache: one video of 2 steps), then second-worker: a new
#    `sagevideo generate` process on that cache; its record splits the start-up (before the load,
#    load, recipe, first step);
# 2. bench_startup on the same folder: each part (imports, CUDA context, load to CPU then moved
#    vs placed directly) in fresh processes;
# 3. with TORCHINDUCTOR_COORDINATE_DESCENT_TUNING=1, an empty cache: bench_transformer eager cuDNN
#    and fp8-compile-sage (its first call is the cold tuning), then fp8-compile-sage alone in a
#    new process on that cache (warm).
# Usage (repo root, on the H200, .site.tar.xz and .tao carried; COMMIT written out: the device's
# git HEAD is stale):  bash tools/gpu_startup_check.sh COMMIT
set -uo pipefail
source tools/gpu_env.sh "$1"
SECONDS=0
export SAGEVIDEO_COMPILE_CACHE=/tmp/sagevideo-compile
timeout 240 python3 -m bench.bench_video --work /tmp/bench-video --arms sage,second-worker --videos 1 --steps 2 \
  --json $OUT/startup-video.json --append-results $OUT/results.jsonl > $OUT/startup-video.txt 2>&1
echo "video rc=$? at ${SECONDS}s"
timeout 130 python3 -m bench.bench_startup --model /tmp/bench-video/model --repeats 2 --json $OUT/startup.json \
  --append-results $OUT/results.jsonl > $OUT/startup.txt 2>&1
echo "startup rc=$? at ${SECONDS}s"
export SAGEVIDEO_COMPILE_CACHE=/tmp/cc-cd TORCHINDUCTOR_COORDINATE_DESCENT_TUNING=1
timeout $((520 - SECONDS)) python3 -m bench.bench_transformer --recipes eager-cudnn,fp8-compile-sage --repeats 2 \
  --no-layer-cosine --json $OUT/cd.json --append-results $OUT/results.jsonl > $OUT/cd.txt 2>&1
echo "cd rc=$? at ${SECONDS}s"
timeout $((590 - SECONDS)) python3 -m bench.bench_transformer --recipes fp8-compile-sage --repeats 1 --no-layer-cosine \
  --json $OUT/cd-warm.json > $OUT/cd-warm.txt 2>&1; echo "cd warm rc=$? at ${SECONDS}s"
grep 'second-worker' $OUT/startup-video.txt | tail -2 | cut -c1-400; tail -9 $OUT/startup.txt
grep -A4 "first call s" $OUT/cd.txt | tail -4; grep -A3 "first call s" $OUT/cd-warm.txt | tail -2
grep -h "from the cache" $OUT/cd.txt $OUT/cd-warm.txt | cut -c1-200; tail -3 $OUT/cd.txt | cut -c1-300
