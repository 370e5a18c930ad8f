set -uo pipefail
tar xJf .site.tar.xz -C /tmp; export PYTHONPATH=$PWD:/tmp/site HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels tests/api/test_attention.py 2>&1 | tee $OUT/gpu-tests.txt | tail -2
timeout 60 python3 scripts/bench_sm90.py --shapes d128-8k --variants s2c1,p2c1 --json $OUT/sm90-pipelined.json > $OUT/sm90-pipelined.txt 2>&1; tail -2 $OUT/sm90-pipelined.txt
timeout 240 python3 scripts/bench_transformer.py --json $OUT/transformer-default.json > $OUT/transformer.txt 2>&1; tail -4 $OUT/transformer.txt
