#!/usr/bin/env python3
"""One transformer forward at real size (random weights, bf16): SDPA cuDNN vs sagevideo.

Builds CogVideoX-5B's transformer config (42 layers, 48 heads of 64) directly on the GPU with
random weights, feeds 49 frames at 480x720 (17,550 video + 226 text tokens) with batch 2 (CFG),
and times one forward with stock attention under SDPA's cuDNN backend and with sagevideo
installed (its default plan, or --pv). A separate, untimed pass measures each layer's worst
cosine (over heads and batch) of sagevideo attention against fp32 SDPA on the same inputs.

With `--model opensora`: Open-Sora 2.0's transformer (11.9 B, 19 double + 38 single blocks,
24 heads × 128), 129 frames 16:9, batch 1: `--resolution 256px` (8,316 video + 512 text tokens) or
`768px` (76,032 + 512). With `--model wan-14b`: diffusers' WanTransformer3DModel at Wan 2.1 14B's
config (40 blocks, 40 heads × 128), 81 frames 720x1280 (75,600 video tokens; 512 text tokens in
cross-attention), batch 1 (the pipeline runs each guidance branch as its own forward). With
`--model hunyuanvideo`: diffusers' HunyuanVideoTransformer3DModel at its 13 B config (20 double +
40 single blocks, 24 heads × 128), 129 frames 720x1280 (118,800 video + 256 text tokens, of which
`--text-tokens` are real and the rest padding masked out by the model's key mask), batch 1.

The per-layer pass compares `--layer-cosine-rows` query rows of every call (evenly spaced; all of
them when a call has fewer) with fp32 SDPA over all keys, so it stays cheap at 100k tokens;
`--no-layer-cosine` skips it. The output cosine always covers the whole output. The SDPA arm runs
under `sdpa_kernel` with cuDNN first (flash, then efficient, where cuDNN refuses a call: the
masked refiner calls of HunyuanVideo).

    python -m bench.bench_transformer [--model cogvideox-5b|opensora] [--pv fp8] [--json out.json]  # GPU
    python -m bench.bench_transformer --model opensora --resolution 768px                          # GPU
    python -m bench.bench_transformer --model wan-14b | --model hunyuanvideo                       # GPU
    python -m bench.bench_transformer --tiny [--model opensora]                                     # CPU smoke test
    (any of them with --append-results [PATH]: also add the rows to bench/results.jsonl)

With `--recipes eager-cudnn,eager-sage,compile-cudnn,compile-sage,fp8-compile-sage` (the default
list with `--recipes default`): each recipe on a freshly built model of the same seed (compile and
fp8 change the model), measured side by side in one run through sagevideo's own recipe
(`sagevideo.pipelines.recipe.apply_recipe`: fp8 = torchao float8 rowwise linears on the blocks,
compile = regional, each block `.compile()`d): ms, × eager cuDNN, × compile cuDNN, output cosine
vs eager cuDNN, the first call's time (compile included; the Inductor cache folder is the
product's persistent one unless TORCHINDUCTOR_CACHE_DIR is set, so a second run shows a warm
start) and the attention backends that ran. A name is `[fp8-](eager|compile)-(cudnn|sdpa|sage)`
(sdpa: stock attention as torch picks its backend, what diffusers runs as shipped; with eager-sdpa
in the list, × eager SDPA too).

    python -m bench.bench_transformer --recipes default [--model wan-14b | --model opensora --resolution 768px]
    python -m bench.bench_transformer --tiny --recipes default          # CPU smoke test (compile backend eager)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

if not __package__:  # run as a file (python bench/bench_transformer.py): `bench` from the repo root, as with -m
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.results import Run, add_results_option, start_run  # noqa: E402
from sagevideo.experiments.bench.forward import DEFAULT_RECIPES as PACKAGE_DEFAULT_RECIPES  # noqa: E402
from sagevideo.experiments.bench.forward import RecipeResult, sdpa_cudnn_first  # noqa: E402
from sagevideo.experiments.bench.forward import parse_recipe_name as package_parse_recipe_name  # noqa: E402
from sagevideo.experiments.bench.forward import recipe_rows as package_recipe_rows  # noqa: E402
from sagevideo.experiments.bench.forward import recipe_table as package_recipe_table  # noqa: E402
from sagevideo.experiments.bench.forward import run_recipes as package_run_recipes  # noqa: E402
from sagevideo.experiments.bench.timing import median_seconds, output_cosine  # noqa: E402
from sagevideo.pipelines.forwards import COGVIDEOX_5B, OPENSORA_TINY  # noqa: E402  (the released 5B config)

TINY = dict(COGVIDEOX_5B, num_attention_heads=2, num_layers=2, text_embed_dim=32, time_embed_dim=8,
            sample_width=8, sample_height=8, sample_frames=9, max_text_seq_length=8)


# 129 frames 16:9: latent (frames, H/8, W/8) of OPENSORA.md's table; tokens = frames·(H/16)·(W/16)
OPENSORA_LATENTS = {"256px": (33, 24, 42), "768px": (33, 72, 128)}


def build_opensora(tiny: bool, device: str, dtype: torch.dtype, resolution: str = "256px"):
    """Open-Sora 2.0 transformer; 16:9 129 frames: 256px latent (33, 24, 42) -> 8316 video tokens,
    768px (33, 72, 128) -> 76032."""
    from sagevideo.pipelines.opensora import OpenSoraTransformer3DModel
    from sagevideo.pipelines.opensora.packing import latent_ids, text_ids

    torch.manual_seed(0)
    with torch.device(device):
        model = OpenSoraTransformer3DModel(**(OPENSORA_TINY if tiny else {}))
    torch.nn.Module.to(model, dtype=dtype).eval()
    cfg = model.config
    frames, h, w, n_txt = (3, 8, 8, 8) if tiny else (*OPENSORA_LATENTS[resolution], 512)
    gen = torch.Generator(device).manual_seed(1)
    ids = latent_ids(1, frames, h, w, dtype=dtype, device=device)
    inputs = dict(
        img=torch.randn(1, ids.shape[1], cfg.in_channels, device=device, dtype=dtype, generator=gen),
        img_ids=ids,
        txt=torch.randn(1, n_txt, cfg.context_in_dim, device=device, dtype=dtype, generator=gen),
        txt_ids=text_ids(1, n_txt, dtype=dtype, device=device),
        timesteps=torch.tensor([0.5], device=device, dtype=dtype),
        y_vec=torch.randn(1, cfg.vec_in_dim, device=device, dtype=dtype, generator=gen),
        cond=torch.zeros(1, ids.shape[1], cfg.cond_in_channels, device=device, dtype=dtype),
    )
    return model, inputs


WAN_TINY = dict(num_attention_heads=2, attention_head_dim=16, text_dim=32, freq_dim=16, ffn_dim=64, num_layers=2,
                rope_max_seq_len=64)
HUNYUAN_TINY = dict(num_attention_heads=2, attention_head_dim=16, num_layers=1, num_single_layers=1,
                    num_refiner_layers=1, text_embed_dim=32, pooled_projection_dim=16, rope_axes_dim=(4, 6, 6))


def build_wan(tiny: bool, device: str, dtype: torch.dtype):
    """Wan 2.1 14B (diffusers' defaults are its config); 81 frames 720x1280 -> latent (21, 90, 160),
    patch (1, 2, 2) -> 75,600 tokens."""
    from diffusers import WanTransformer3DModel

    torch.manual_seed(0)
    with torch.device(device):
        model = WanTransformer3DModel(**(WAN_TINY if tiny else {}))
    torch.nn.Module.to(model, dtype=dtype).eval()
    frames, h, w, n_txt = (3, 8, 8, 8) if tiny else (21, 90, 160, 512)
    gen = torch.Generator(device).manual_seed(1)
    inputs = dict(
        hidden_states=torch.randn(1, 16, frames, h, w, device=device, dtype=dtype, generator=gen),
        timestep=torch.tensor([500], device=device),
        encoder_hidden_states=torch.randn(1, n_txt, model.config.text_dim, device=device, dtype=dtype, generator=gen),
        return_dict=False,
    )
    return model, inputs


def build_hunyuan(tiny: bool, device: str, dtype: torch.dtype, text_tokens: int = 64):
    """HunyuanVideo 13B (diffusers' defaults); 129 frames 720x1280 -> latent (33, 90, 160), patch 2
    -> 118,800 video tokens, plus 256 text tokens of which `text_tokens` are unmasked."""
    from diffusers import HunyuanVideoTransformer3DModel

    torch.manual_seed(0)
    with torch.device(device):
        model = HunyuanVideoTransformer3DModel(**(HUNYUAN_TINY if tiny else {}))
    torch.nn.Module.to(model, dtype=dtype).eval()
    cfg = model.config
    frames, h, w, n_txt = (3, 8, 8, 8) if tiny else (33, 90, 160, 256)
    real = min(text_tokens, n_txt) if not tiny else 5
    gen = torch.Generator(device).manual_seed(1)
    mask = torch.zeros(1, n_txt, device=device, dtype=torch.bool)
    mask[:, :real] = True
    inputs = dict(
        hidden_states=torch.randn(1, cfg.in_channels, frames, h, w, device=device, dtype=dtype, generator=gen),
        timestep=torch.tensor([500], device=device),
        encoder_hidden_states=torch.randn(1, n_txt, cfg.text_embed_dim, device=device, dtype=dtype, generator=gen),
        encoder_attention_mask=mask,
        pooled_projections=torch.randn(1, cfg.pooled_projection_dim, device=device, dtype=dtype, generator=gen),
        guidance=torch.tensor([6000.0], device=device, dtype=dtype),
        return_dict=False,
    )
    return model, inputs


def sampled_reference(q, k, v, attn_mask, rows: int | None):
    """fp32 SDPA of `rows` evenly spaced query rows (all when rows is None or there are fewer) over
    every key, and the index of those rows. q, k, v: (B, H, N, D); attn_mask broadcastable as
    (B, H, Nq, Nk) or None."""
    n_q = q.shape[-2]
    index = None if rows is None or n_q <= rows else torch.linspace(0, n_q - 1, rows, device=q.device).long()
    if index is not None:
        q = q[:, :, index]
        if attn_mask is not None and attn_mask.dim() >= 2 and attn_mask.shape[-2] == n_q:
            attn_mask = attn_mask[..., index, :]
    if attn_mask is not None and attn_mask.dtype == torch.bool and attn_mask.dim() == 4 and attn_mask.shape[-2] == 1:
        attn_mask = attn_mask.expand(-1, -1, q.shape[-2], -1)  # the fp32 efficient kernel wants the query dim
    ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=attn_mask)
    return ref, index


def build(cfg: dict, device: str, dtype: torch.dtype):
    from diffusers import CogVideoXTransformer3DModel
    from diffusers.models.embeddings import get_3d_rotary_pos_embed

    torch.manual_seed(0)
    with torch.device(device):
        model = CogVideoXTransformer3DModel(**cfg)
    torch.nn.Module.to(model, dtype=dtype).eval()
    frames = (cfg["sample_frames"] - 1) // cfg["temporal_compression_ratio"] + 1
    h, w, p = cfg["sample_height"], cfg["sample_width"], cfg["patch_size"]
    gen = torch.Generator(device).manual_seed(1)
    hidden = torch.randn(2, frames, cfg["in_channels"], h, w, device=device, dtype=dtype, generator=gen)
    text = torch.randn(2, cfg["max_text_seq_length"], cfg["text_embed_dim"], device=device, dtype=dtype, generator=gen)
    cos, sin = get_3d_rotary_pos_embed(
        cfg["attention_head_dim"], ((0, 0), (h // p, w // p)), (h // p, w // p), frames, device=torch.device(device)
    )
    inputs = dict(hidden_states=hidden, encoder_hidden_states=text, timestep=torch.tensor([500, 500], device=device),
                  image_rotary_emb=(cos, sin), return_dict=False)
    return model, inputs


def result_rows(run: Run, shape: str, result: dict) -> Run:
    """One forward's result as results-file rows, named as the older runs' converted rows are:
    sdpa-cudnn and sagevideo-PV (PV of the plan that ran) `ms`, the latter's `speedup`,
    `output_cos_vs_sdpa` and, with the per-layer pass, `layer_cos_worst_min` (its layer and every
    layer's value in extra) and `layer_cos_worst_mean`."""
    plan = result["plan"]
    sage = f"sagevideo-{plan.split('/')[0].split('-')[1]}"  # "int8-fp8/block" -> sagevideo-fp8
    run.add(shape, "sdpa-cudnn", "ms", result["sdpa_cudnn_s"] * 1e3, config=result["config"])
    run.add(shape, sage, "ms", result["sagevideo_s"] * 1e3, plan=plan, backends=result["backends"])
    run.add(shape, sage, "speedup", result["speedup"])
    run.add(shape, sage, "output_cos_vs_sdpa", result["output_cos_vs_sdpa"])
    layers = result["per_layer_worst_cos"]
    if layers:
        worst = min(layers, key=layers.get)
        run.add(shape, sage, "layer_cos_worst_min", layers[worst], layer=worst, per_layer=layers)
        run.add(shape, sage, "layer_cos_worst_mean", sum(layers.values()) / len(layers))
    return run


DEFAULT_RECIPES = ",".join(PACKAGE_DEFAULT_RECIPES)


def parse_recipe_name(name: str) -> dict:
    """'fp8-compile-sage' -> {"linear": "fp8", "compile": "regional", "attention": "sage"}; a bad name exits."""
    try:
        return package_parse_recipe_name(name)
    except ValueError as err:
        raise SystemExit(f"--recipes: {err}") from None


def run_recipes(names: list[str], build_model, *, tiny: bool, repeats: int, compile_backend: str) -> dict:
    """`sagevideo.experiments.bench.forward.run_recipes` on this script's models: {name: {ms,
    first_call_s, backends, output_cos_vs_eager_cudnn, x_eager_cudnn, x_compile_cudnn, recipe, ...}}.
    build_model() -> (model, inputs)."""
    from sagevideo.pipelines.forwards import StepForwards

    for name in names:
        parse_recipe_name(name)
    device, dtype = ("cpu", "float16") if tiny else ("cuda", "bfloat16")

    def build():
        model, inputs = build_model()
        return StepForwards("", model, [inputs])

    results = package_run_recipes(names, build, device=device, dtype=dtype, repeats=repeats,
                                  compile_backend=compile_backend, backend="reference" if tiny else "auto",
                                  progress=lambda line: print(line, flush=True))
    return {r.name: r.model_dump() for r in results}


def recipe_rows(run: Run, shape: str, results: dict) -> Run:
    """The recipes' results (`run_recipes`'s dicts) as results-file rows, as `sagevideo bench forward
    --append-results` writes them (`sagevideo.experiments.bench.forward.recipe_rows`)."""
    package_recipe_rows(run, shape, [RecipeResult(**r) for r in results.values()])
    return run


def recipe_table(results: dict) -> list[str]:
    """The side-by-side table, one line per recipe (`run_recipes`'s dicts)."""
    return package_recipe_table([RecipeResult(**r) for r in results.values()])


def main(argv: list[str] | None = None) -> int:
    import sagevideo
    from sagevideo.attention.accuracy import error_stats
    from sagevideo.pipelines.install import install_router
    from sagevideo.pipelines.routing import AttentionRouter

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pv", choices=["fp16", "fp8"], help="uniform PV mode (default: sagevideo's default plan)")
    parser.add_argument("--model", choices=["cogvideox-5b", "opensora", "wan-14b", "hunyuanvideo"],
                        default="cogvideox-5b")
    parser.add_argument("--text-tokens", type=int, default=64,
                        help="HunyuanVideo: unmasked prompt tokens of the 256 (the rest is key padding)")
    parser.add_argument("--layer-cosine-rows", type=int, default=2048,
                        help="query rows per call compared with fp32 SDPA in the per-layer pass (0: all)")
    parser.add_argument("--resolution", choices=sorted(OPENSORA_LATENTS), default="256px",
                        help="Open-Sora: 129 frames 16:9 at this resolution")
    parser.add_argument("--no-layer-cosine", action="store_true",
                        help="skip the per-layer accuracy pass against fp32 SDPA (slow at 76k tokens)")
    parser.add_argument("--tiny", action="store_true", help="tiny config on CPU (smoke test)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json")
    parser.add_argument("--recipes", help=f"comma-separated recipes side by side ('default': {DEFAULT_RECIPES})")
    parser.add_argument("--compile-backend", choices=["inductor", "aot_eager", "eager"],
                        help="torch.compile backend of the compile recipes (default: inductor; eager with --tiny)")
    add_results_option(parser)
    args = parser.parse_args(argv)
    device = "cpu" if args.tiny else "cuda"
    dtype = torch.float16 if args.tiny else torch.bfloat16
    backend = "reference" if args.tiny else "auto"
    if args.recipes:
        return recipes_main(args, argv, device, dtype)
    if args.model == "opensora":
        model, inputs = build_opensora(args.tiny, device, dtype, args.resolution)
        description = f"Open-Sora 2.0 transformer (random weights), 129 frames {args.resolution} 16:9, batch 1, bf16"
    elif args.model == "wan-14b":
        model, inputs = build_wan(args.tiny, device, dtype)
        description = "Wan 2.1 14B transformer (random weights), 81 frames 720x1280, batch 1, bf16"
    elif args.model == "hunyuanvideo":
        model, inputs = build_hunyuan(args.tiny, device, dtype, args.text_tokens)
        description = (f"HunyuanVideo transformer (random weights), 129 frames 720x1280, batch 1, "
                       f"{args.text_tokens}/256 text tokens, bf16")
    else:
        model, inputs = build(TINY if args.tiny else COGVIDEOX_5B, device, dtype)
        description = "CogVideoX-5B (random weights), 2x49 frames 480x720, bf16"

    def forward():
        with torch.no_grad():
            out = model(**inputs)
            return out[0] if isinstance(out, tuple) else out

    with sdpa_cudnn_first(device):  # flash, then efficient, only for calls cuDNN refuses (masked refiner calls)
        sdpa_s = median_seconds(forward, args.repeats, device)
        ref_out = forward()
    with sagevideo.install(model, pv=args.pv, backend=backend) as handle, sagevideo.record_backends() as log:
        plan = handle.plan.default.label
        sage_s = median_seconds(forward, args.repeats, device)
        sage_out = forward()
    backends = log.counts

    class Measuring(AttentionRouter):
        """sagevideo attention, compared per call with fp32 SDPA on the same inputs."""

        worst: dict[str, float] = {}

        def __call__(self, layer, q, k, v, **kw):
            out = super().__call__(layer, q, k, v, **kw)
            ref, index = sampled_reference(q, k, v, kw.get("attn_mask"), rows)
            got = out if index is None else out[:, :, index]
            self.worst[layer] = min(self.worst.get(layer, 1.0), error_stats(ref, got).cos_worst)
            return out

    rows = args.layer_cosine_rows or None
    measuring = Measuring(handle.plan, backend)
    if not args.no_layer_cosine:
        with install_router(model, measuring):
            forward()
    out_cos = output_cosine(ref_out, sage_out)
    result = {
        "config": "tiny" if args.tiny else description,
        "sdpa_cudnn_s": sdpa_s, "sagevideo_s": sage_s, "speedup": sdpa_s / sage_s, "plan": plan,
        "backends": backends, "per_layer_worst_cos": measuring.worst, "output_cos_vs_sdpa": out_cos,
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
    }
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=2)
    if args.append_results:
        shapes = {"opensora": f"opensora-{args.resolution}", "wan-14b": "wan-14b-720p-81f",
                  "hunyuanvideo": "hunyuanvideo-720p-129f"}
        shape = shapes.get(args.model, args.model)
        run = start_run("bench_transformer", result["gpu"], argv)
        added = result_rows(run, f"{args.model}-tiny" if args.tiny else shape, result).append(args.append_results)
        print(f"bench_transformer: {added} rows appended to {args.append_results}")
    print(f"forward: SDPA cuDNN {sdpa_s * 1e3:.0f} ms, sagevideo ({plan}) {sage_s * 1e3:.0f} ms -> "
          f"{sdpa_s / sage_s:.2f}x; attention calls {backends}")
    if measuring.worst:
        worst_layer = min(measuring.worst, key=measuring.worst.get)
        print(f"per-layer worst cosine vs fp32 SDPA: min {measuring.worst[worst_layer]:.5f} ({worst_layer}), "
              f"mean {sum(measuring.worst.values()) / len(measuring.worst):.5f}")
    print(f"transformer output cosine vs stock SDPA: {out_cos:.5f}")
    return 0


def recipes_main(args, argv, device: str, dtype) -> int:
    """`--recipes`: every recipe on the chosen model, the table last, JSON with --json."""
    builders = {
        "opensora": lambda: build_opensora(args.tiny, device, dtype, args.resolution),
        "wan-14b": lambda: build_wan(args.tiny, device, dtype),
        "hunyuanvideo": lambda: build_hunyuan(args.tiny, device, dtype, args.text_tokens),
    }
    build_model = builders.get(args.model, lambda: build(TINY if args.tiny else COGVIDEOX_5B, device, dtype))
    names = (DEFAULT_RECIPES if args.recipes == "default" else args.recipes).split(",")
    compile_backend = args.compile_backend or ("eager" if args.tiny else "inductor")
    results = run_recipes([n.strip() for n in names], build_model, tiny=args.tiny, repeats=args.repeats,
                          compile_backend=compile_backend)
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    shapes = {"opensora": f"opensora-{args.resolution}", "wan-14b": "wan-14b-720p-81f",
              "hunyuanvideo": "hunyuanvideo-720p-129f"}
    shape = f"{args.model}-tiny" if args.tiny else shapes.get(args.model, args.model)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"model": args.model, "shape": shape, "gpu": gpu, "compile_backend": compile_backend,
                       "recipes": results}, fh, indent=2)
    if args.append_results:
        added = recipe_rows(start_run("bench_transformer", gpu, argv), shape, results).append(args.append_results)
        print(f"bench_transformer: {added} rows appended to {args.append_results}")
    print(f"{shape} on {gpu}, compile backend {compile_backend}:")
    for line in recipe_table(results):
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
