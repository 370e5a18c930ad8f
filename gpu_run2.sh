set -uo pipefail
tar xJf .site.tar.xz -C /tmp; export PYTHONPATH=$PWD:/tmp/site HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels -x 2>&1 | tee $OUT/gpu-tests.txt | tail -2
timeout 60 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_triton_kernels.py -k "mma_key or bit_for_bit" 2>&1 | tail -1
timeout 150 python3 scripts/bench_sm90.py --shapes cogvideox-2b,d128-8k,d128-32k,d128-75k --variants s2c1,s3c1 --json $OUT/sm90.json > $OUT/sm90.txt 2>&1; tail -8 $OUT/sm90.txt
python3 scripts/bench_attention.py --shapes cogvideox-2b,cogvideox-5b,d128-8k,d128-32k,d128-75k --json $OUT/bench.json 2>&1 | tee $OUT/bench.txt | tail -9
