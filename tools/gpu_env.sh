# Sourced by the tools/gpu_*_check.sh scripts of the recipe work (repo root, on the GPU machine,
# .site.tar.xz and .tao/torchao-*.whl carried): the packages the image lacks under /tmp/site,
# torchao beside them, the offline/unbuffered settings, BENCH_COMMIT from $1 (the device's git HEAD
# is stale, so callers pass this checkout's `git rev-parse HEAD`).
# With GPU_ENV_BYTECODE=1 it also byte-compiles the site, sagevideo, torch and transformers into
# PYTHONPYCACHEPREFIX: the image sets PYTHONDONTWRITEBYTECODE=1 and ships no bytecode, so every
# process would compile its imports from source (about 12 s of a worker's start), which a pip
# install would not leave a user paying.
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 BENCH_COMMIT=${1:?pass the commit hash}
[ -d /tmp/site ] || tar xJf .site.tar.xz -C /tmp
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .tao/*.whl 2>&1 | tail -1
if [ "${GPU_ENV_BYTECODE:-0}" = 1 ]; then
  export PYTHONPYCACHEPREFIX=/tmp/pyc; unset PYTHONDONTWRITEBYTECODE
  python3 -m compileall -q -j 16 /tmp/site "$PWD/sagevideo" $(python3 -c "import os, torch, transformers
print(*(os.path.dirname(m.__file__) for m in (torch, transformers)))") > /dev/null 2>&1
fi
