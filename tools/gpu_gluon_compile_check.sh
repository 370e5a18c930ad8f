#!/usr/bin/env bash
# One GPU call for the Gluon sm90 kernel under torch.compile (branch gluon-compile): the gpu tests
# of the op boundary (Inductor, fullgraph, d128 FP8: the graph calls sageattn_fwd_gluon, records
# gluon/fp8, equals eager bit for bit), the Gluon kernel's own gpu tests, the plan tests (select_plan
# traced into one graph), the interception under Inductor; then Wan 2.1 14B eager-sage against
# compile-sage, whose "attention calls" column must now read gluon/fp8 for both.
# Usage (repo root, on the H200, .site.tar.xz carried):
#   BENCH_COMMIT=<git rev-parse HEAD, here> bash tools/gpu_gluon_compile_check.sh [OUT_DIR] [BENCH_LIMIT_S]
# About 6-8 minutes: the tests ~2-3, the two Wan recipes (random weights, one repeat) ~3-5.
set -uo pipefail
out=${1:-${OUT:-/tmp/sagevideo-gpu}}
mkdir -p "$out"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
if [ -f .site.tar.xz ] && [ ! -d /tmp/site ]; then  # pre-installed packages (tools/gpu_site.sh)
  tar xJf .site.tar.xz -C /tmp
fi
[ -d /tmp/site ] && export PYTHONPATH=$PYTHONPATH:/tmp/site
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"
timeout 240 python3 -m pytest -q -p no:cacheprovider -rs -m gpu tests/kernels/test_op.py tests/kernels/test_attention_sm90.py \
  "tests/kernels/test_gpu.py::test_torch_compile_fullgraph_inductor" \
  "tests/pipelines/test_intercept.py::test_regional_compile_with_the_interception_under_inductor_on_gpu" \
  2>&1 | tee "$out/pytest-gluon-compile.txt" | tail -15
timeout 60 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_plans.py 2>&1 | tail -2
timeout "${2:-330}" python3 -m bench.bench_transformer --model wan-14b --recipes eager-sage,compile-sage --repeats 1 \
  --no-layer-cosine --json "$out/recipes-wan-gluon.json" --append-results "$out/results.jsonl" \
  > "$out/recipes-wan-gluon.txt" 2>&1
echo "wan recipes rc=$?"
tail -6 "$out/recipes-wan-gluon.txt"
