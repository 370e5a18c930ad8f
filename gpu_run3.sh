set -uo pipefail
tar xJf .site.tar.xz -C /tmp; export PYTHONPATH=$PWD:/tmp/site HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
timeout 220 python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels 2>&1 | tee $OUT/gpu-tests.txt | tail -3
timeout 60 python3 scripts/bench_sm90.py --shapes d128-8k --variants s2c1,p2c1 --json $OUT/sm90-pipelined.json > $OUT/sm90-pipelined.txt 2>&1; tail -3 $OUT/sm90-pipelined.txt
python3 scripts/bench_attention.py --shapes cogvideox-2b,cogvideox-5b --sweep cogvideox-2b,cogvideox-5b --sweep-pv fp8 \
  --sweep-tiles 64x128 --sweep-launch 4x3,4x4,4x5 --json $OUT/bench-stages.json 2>&1 | tee $OUT/bench-stages.txt | tail -6
