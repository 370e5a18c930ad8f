#!/usr/bin/env bash
# One call on the GPU machine: kernel/attention tests (GPU-marked included), then the benchmark table.
# Usage (repo root, on the GPU machine): bash tools/gpu_check.sh [OUT_DIR] [bench_attention args...]
#   e.g. BENCH_COMMIT=<git rev-parse HEAD, here> bash tools/gpu_check.sh "$OUT" --append-results "$OUT/results.jsonl"
#   then, here: python -m bench.results add <fetched results.jsonl>
set -uo pipefail
out=${1:-${OUT:-/tmp/sagevideo-gpu}}; shift || true
mkdir -p "$out"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
if [ -f .site.tar.xz ] && [ ! -d /tmp/site ]; then  # packages the GPU image lacks, packed beforehand (a site folder as tar.xz)
  tar xJf .site.tar.xz -C /tmp && export PYTHONPATH=$PYTHONPATH:/tmp/site
elif [ -d /tmp/site ]; then
  export PYTHONPATH=$PYTHONPATH:/tmp/site
elif ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=$PYTHONPATH:/tmp/site
fi
python3 -c "import torch; print(\"tf32 matmul:\", torch.backends.cuda.matmul.allow_tf32, torch.get_float32_matmul_precision())"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv | tee "$out/gpu.txt"
tests=()  # the kernel and attention-op tests, wherever the test tree has them
for t in tests/kernels tests/attention; do [ -e "$t" ] && tests+=("$t"); done
python3 -m pytest -q -p no:cacheprovider "${tests[@]}" -rs 2>&1 | tee "$out/pytest.txt" | tail -25
python3 -m bench.bench_attention --json "$out/bench.json" "$@" 2>&1 | tee "$out/bench.txt" | tail -20
