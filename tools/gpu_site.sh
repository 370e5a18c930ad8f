#!/usr/bin/env bash
# Build .site.tar.xz (repo root): the packages the GPU image lacks, installed for its Python 3.12,
# xz-compressed so that they fit the 64 MiB a device call can carry (the wheels alone do not:
# ray 47 MB + imageio-ffmpeg 29 MB). tools/gpu_check.sh unpacks it to /tmp/site.
# Usage (here, not on the GPU): bash tools/gpu_site.sh   (about 4 minutes, most of it xz)
set -euo pipefail
root=$(git rev-parse --show-toplevel)
cd "$root"
bash ../shared/device/wheels.sh pydantic==2.14.4 pydantic_core==2.50.5 annotated-types typing-inspection \
  sageattention==1.0.6 imageio-ffmpeg==0.7.0
tmp=$(mktemp -d)
python3 -m pip install -q --no-index --no-deps --no-compile --target "$tmp/site" \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --python-version 3.12 --only-binary=:all: .whl/*.whl
tar cf - -C "$tmp" site | xz -9 -T0 > .site.tar.xz
rm -rf "$tmp"
ls -la .site.tar.xz
