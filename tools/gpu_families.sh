#!/usr/bin/env bash
# One call on the GPU machine for the model families: whole transformer forwards at the families'
# long settings (default plan vs SDPA cuDNN-first, per-layer worst cosine vs fp32), then one tiny
# generation per built-in model with --backend triton, its manifest's backends printed last.
# Usage (repo root, on the GPU machine): BENCH_COMMIT=<sha> bash tools/gpu_families.sh OUT [forwards|tiny|all]
# (NO_SITE=1 DEVICE=cpu BACKEND=reference bash tools/gpu_families.sh /tmp/f tiny: the same generations on CPU)
set -uo pipefail
out=${1:?OUT folder}; what=${2:-all}
mkdir -p "$out"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 RAY_AUTH_MODE=disabled
if [ -z "${NO_SITE:-}" ]; then  # the GPU image's missing packages (tools/gpu_site.sh); NO_SITE=1 here
  if [ -f .site.tar.xz ] && [ ! -d /tmp/site ]; then tar xJf .site.tar.xz -C /tmp; fi
  [ -d /tmp/site ] && export PYTHONPATH=$PYTHONPATH:/tmp/site
fi
if [ "$what" != tiny ]; then
  for spec in "cogvideox-5b 3" "opensora --resolution 768px 2"; do
    set -- $spec; model=$1; repeats=${!#}; extra=("${@:2:$#-2}")
    python3 -m bench.bench_transformer --model "$model" "${extra[@]}" --repeats "$repeats" \
      --json "$out/forward-$model.json" --append-results "$out/results.jsonl" > "$out/forward-$model.txt" 2>&1
    echo "forward $model rc=$?"; tail -3 "$out/forward-$model.txt"
  done
fi
if [ "$what" != forwards ]; then
  rm -rf /tmp/sagevideo-gen
  python3 - <<'PY'
from PIL import Image
Image.new("RGB", (64, 64), (200, 120, 40)).save("/tmp/first.png")
PY
  models=${MODELS:-$(python3 -c "from sagevideo.pipelines import families; print(' '.join(n for f in families.every() if f.generates for n in f.tiny_models))")}
  for model in $models; do
    image=$(python3 -c "
from sagevideo.pipelines.loading import resolve_model
s = resolve_model('$model'); print(s.model_family.image_input(s) or '')")
    gen=/tmp/sagevideo-gen/$model  # the videos stay on the machine: a call brings back few files
    args=(--model "$model" --out "$gen" --device "${DEVICE:-cuda}" --backend "${BACKEND:-triton}" --no-progress)
    [ "$image" = required ] && args+=(--image /tmp/first.png)
    python3 -m sagevideo generate --prompt "a lighthouse at dusk, waves" "${args[@]}" >> "$out/tiny.txt" 2>&1
    echo "generate $model rc=$? image=${image:-none}: $(tail -1 "$out/tiny.txt")"
    tail -1 "$gen/manifest.jsonl" >> "$out/tiny-manifests.jsonl"
    python3 -c "
import json; r = json.loads(open('$gen/manifest.jsonl').read().splitlines()[-1])
print('   ', r['family'], r['status'], r['backend'], r['backends'])" 2>&1 | tail -1
  done
fi
