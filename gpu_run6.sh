set -uo pipefail
tar xJf .site.tar.xz -C /tmp; export PYTHONPATH=$PWD:/tmp/site HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
timeout 120 python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_attention_sm90.py 2>&1 | tee $OUT/gpu-tests-sm90.txt | tail -2
timeout 60 python3 scripts/bench_sm90.py --shapes cogvideox-2b,d128-8k --variants s2c1,p2c1 --json $OUT/sm90-pipelined.json > $OUT/sm90-pipelined.txt 2>&1; tail -3 $OUT/sm90-pipelined.txt
