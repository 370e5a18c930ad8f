set -uo pipefail
tar xJf .site.tar.xz -C /tmp; export PYTHONPATH=$PWD:/tmp/site HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu,power.draw --format=csv
timeout 240 python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels -x 2>&1 | tee $OUT/gpu-tests.txt | tail -4
python3 scripts/bench_attention.py --shapes cogvideox-2b,d128-8k --sweep cogvideox-2b,d128-8k --sweep-pv fp8 \
  --sweep-tiles 128x128,64x128 --sweep-launch 4x3,4x2 --sweep-orders mma,natural --json $OUT/bench.json 2>&1 | tee $OUT/bench.txt | tail -14
