#!/usr/bin/env bash
# One GPU call for issue 21: one whole CogVideoX-5B video per arm (bench/bench_video.py), stock
# diffusers against sagevideo's recipe, decode included; the compile cache starts empty. Then the
# forward alone (bench_transformer, the cache warm), with the GPU's clocks and power sampled
# throughout ($OUT/smi.csv, phases in $OUT/phases.txt): per step, both pipelines take longer than
# the forward alone.
# Byte-compiles first (tools/gpu_env.sh says why).
# Usage (repo root, on the GPU machine, .site.tar.xz and .tao/torchao-*.whl carried; COMMIT is this
# checkout's `git rev-parse HEAD` written out: on the device, git's HEAD is stale):
#   bash tools/gpu_video_check.sh COMMIT [LIMIT_S] [ARMS]
set -uo pipefail
GPU_ENV_BYTECODE=1 source tools/gpu_env.sh "$1"
export SAGEVIDEO_COMPILE_CACHE=/tmp/sagevideo-compile TORCH_LOGS=recompiles
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv -lms 1000 > $OUT/smi.csv &
SECONDS=0
phase() { echo "$(date '+%Y/%m/%d %H:%M:%S') $1" >> $OUT/phases.txt; }
phase video
timeout "${2:-420}" python3 -m bench.bench_video --work /tmp/bench-video --arms "${3:-sage,stock,second-worker}" \
  --json $OUT/video.json --append-results $OUT/results.jsonl > $OUT/video.txt 2>&1; echo "video rc=$? at ${SECONDS}s"
phase forward
timeout $((560 - SECONDS)) python3 -m bench.bench_transformer --recipes eager-cudnn,fp8-compile-sage --repeats 3 \
  --no-layer-cosine --json $OUT/forward.json --append-results $OUT/results.jsonl > $OUT/forward.txt 2>&1
echo "forward rc=$? at ${SECONDS}s"; phase end
echo "recompile lines: $(grep -c 'Recompiling function' $OUT/video.txt)"
grep 'bench_video:' $OUT/video.txt | tail -6 | cut -c1-300; tail -8 $OUT/video.txt | cut -c1-300
grep -A3 "first call s" $OUT/forward.txt | tail -3
