"""One denoising step's transformer forwards at a model's real size (or tiny), random weights.

`build_step(name, device, dtype, frames=, height=, width=)` builds the transformer of a published
config ("cogvideox-5b", "wan-14b", "hunyuanvideo", "opensora-768px", or "tiny-<family>") with
random weights directly on `device`, and the inputs of one denoising step at the given video
size, batched as the family's pipeline batches guidance: CogVideoX one forward of batch 2 (CFG),
Open-Sora one of batch 3 (text + image guidance), Wan two forwards of batch 1 (each guidance
branch its own call), HunyuanVideo one of batch 1 (guidance-distilled).

`attention_calls(name, ...)`: the attention calls one step makes (shapes and counts), found by
running the step on the meta device (no memory, no compute), so a config's real shapes are read
from the model itself rather than re-derived per family; `step_size(name, ...)` adds the
parameter count and batch (what a run's memory and time are estimated from).

Random weights because what a step's time is spent on depends on the shapes, not on the values:
profiling and benchmarks run without a 30 GB checkpoint. The configs are the published ones
(diffusers' defaults for Wan 2.1 14B and HunyuanVideo 13B, CogVideoX-5B's config.json, the
Open-Sora 2.0 port's defaults).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import torch

COGVIDEOX_5B = dict(
    num_attention_heads=48, attention_head_dim=64, in_channels=16, out_channels=16, time_embed_dim=512,
    text_embed_dim=4096, num_layers=42, sample_width=90, sample_height=60, sample_frames=49, patch_size=2,
    temporal_compression_ratio=4, max_text_seq_length=226, activation_fn="gelu-approximate",
    timestep_activation_fn="silu", norm_elementwise_affine=True, norm_eps=1e-5, spatial_interpolation_scale=1.875,
    temporal_interpolation_scale=1.0, use_rotary_positional_embeddings=True,
)
# CogVideoX-5B's scheduler_config.json (a CogVideoXDPMScheduler)
COGVIDEOX_5B_SCHEDULER = dict(
    beta_schedule="scaled_linear", beta_start=0.00085, beta_end=0.012, clip_sample=False,
    prediction_type="v_prediction", rescale_betas_zero_snr=True, set_alpha_to_one=True, snr_shift_scale=1.0,
    steps_offset=0, timestep_spacing="trailing",
)
WAN_TINY = dict(num_attention_heads=2, attention_head_dim=64, in_channels=4, out_channels=4, text_dim=32,
                freq_dim=16, ffn_dim=64, num_layers=2, rope_max_seq_len=64)
OPENSORA_TINY = dict(hidden_size=64, num_heads=2, depth=1, depth_single_blocks=1, axes_dim=(8, 12, 12),
                     context_in_dim=32, vec_in_dim=16)

# name -> (family, default frames, height, width); tiny ones at a few latent tokens
CONFIGS = {
    "cogvideox-5b": ("cogvideox", 49, 480, 720),
    "wan-14b": ("wan", 81, 720, 1280),
    "hunyuanvideo": ("hunyuanvideo", 129, 720, 1280),
    "opensora-768px": ("opensora", 129, 576, 1024),  # Open-Sora's 768px bucket at 16:9 (OPENSORA.md)
    "tiny-cogvideox": ("cogvideox", 9, 64, 64),
    "tiny-wan": ("wan", 9, 64, 64),
    "tiny-hunyuanvideo": ("hunyuanvideo", 9, 64, 64),
    "tiny-opensora": ("opensora", 9, 64, 64),
}
TEMPORAL, SPATIAL = 4, 8  # every family's VAE: 4x in time, 8x in space


@dataclass
class StepForwards:
    """A transformer and the forwards of one denoising step.

    forwards: one kwargs dict per transformer call of the step (guidance branches the pipeline runs
    as separate calls); blocks: the repeated transformer blocks (the units of regional compile);
    tokens: video tokens per sample.
    """

    name: str
    model: torch.nn.Module
    forwards: list[dict] = field(default_factory=list)
    blocks: list[torch.nn.Module] = field(default_factory=list)
    tokens: int = 0

    def run(self) -> list[torch.Tensor]:
        """Every forward of the step (under no_grad); their first outputs."""
        with torch.no_grad():
            return [_first(self.model(**kwargs)) for kwargs in self.forwards]


def _first(out) -> torch.Tensor:
    return out[0] if isinstance(out, (tuple, list)) else getattr(out, "sample", out)


def known_config(name: str) -> str:
    """`name` when it is one of CONFIGS; else ValueError listing them."""
    if name not in CONFIGS:
        raise ValueError(f"unknown model config {name!r}; use one of {', '.join(sorted(CONFIGS))}")
    return name


def latent_shape(frames: int, height: int, width: int) -> tuple[int, int, int]:
    """(latent frames, latent height, latent width) of a video: (F - 1) / 4 + 1, H / 8, W / 8."""
    for what, value, multiple in (("height", height, 16), ("width", width, 16)):
        if value % multiple:
            raise ValueError(f"{what} {value} is not a multiple of {multiple} (8x VAE, 2x2 patches)")
    if frames < 1 or (frames - 1) % TEMPORAL:
        raise ValueError(f"frames {frames} must be 4k + 1 (the VAE compresses time 4x), e.g. 49 or 81")
    return (frames - 1) // TEMPORAL + 1, height // SPATIAL, width // SPATIAL


def build_step(name: str, device: str | torch.device = "cpu", dtype: torch.dtype = torch.bfloat16, *,
               frames: int | None = None, height: int | None = None, width: int | None = None,
               seed: int = 0) -> StepForwards:
    """The transformer of config `name` (see CONFIGS) with random weights from `seed`, on `device` in
    `dtype`, and the forwards of one denoising step at frames x height x width (the config's
    defaults where None). Raises ValueError for an unknown name or a size the VAE cannot take."""
    known_config(name)
    family, f0, h0, w0 = CONFIGS[name]
    latent = latent_shape(frames or f0, height or h0, width or w0)
    tiny = name.startswith("tiny-")
    builder = {"cogvideox": _cogvideox, "wan": _wan, "hunyuanvideo": _hunyuan, "opensora": _opensora}[family]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        with torch.device(device):
            step = builder(tiny, latent, torch.device(device), dtype)
    step.name = name
    torch.nn.Module.to(step.model, dtype=dtype).eval()
    return step


@dataclass(frozen=True)
class AttentionCallShape:
    """One distinct attention call of a step: q (batch, heads, n_q, head_dim), k/v (batch, heads,
    n_k, head_dim); masked: it came with an attn_mask; calls: how often the step makes it."""

    batch: int
    heads: int
    n_q: int
    n_k: int
    head_dim: int
    masked: bool
    calls: int


@dataclass(frozen=True)
class StepSize:
    """What one denoising step of a config holds and does, read from the model on the meta device:
    parameters (count), samples (batch summed over the step's forwards), tokens (video tokens per
    sample), calls (its distinct attention calls, most calls first)."""

    parameters: int
    samples: int
    tokens: int
    calls: tuple[AttentionCallShape, ...]


def attention_calls(name: str, *, frames: int | None = None, height: int | None = None,
                    width: int | None = None) -> list[AttentionCallShape]:
    """The distinct SDPA calls of one denoising step of config `name` at the given size, most
    calls first. Built and run on the meta device: seconds even at real size. Raises ValueError as
    `build_step` does."""
    return list(step_size(name, frames=frames, height=height, width=width).calls)


@functools.lru_cache(maxsize=8)  # a real-size build takes seconds even on the meta device
def step_size(name: str, *, frames: int | None = None, height: int | None = None,
              width: int | None = None) -> StepSize:
    """One denoising step of config `name` at the given size, measured without memory or compute
    (built and run on the meta device: seconds even at real size). Raises ValueError as
    `build_step` does."""
    from torch.overrides import TorchFunctionMode

    seen: dict[tuple, int] = {}

    class _Recorder(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func is torch.nn.functional.scaled_dot_product_attention:
                # diffusers' dispatcher passes query/key by keyword, the CogVideoX processors by position
                q = args[0] if args else kwargs["query"]
                k = args[1] if len(args) > 1 else kwargs["key"]
                mask = args[3] if len(args) > 3 else kwargs.get("attn_mask")
                key = (q.shape[0], q.shape[1], q.shape[2], k.shape[2], q.shape[3], mask is not None)
                seen[key] = seen.get(key, 0) + 1
            return func(*args, **kwargs)

    step = build_step(name, "meta", torch.bfloat16, frames=frames, height=height, width=width)
    with _Recorder():
        step.run()
    calls = [AttentionCallShape(*key, calls=count) for key, count in seen.items()]
    samples = sum(next(v for v in kwargs.values() if isinstance(v, torch.Tensor)).shape[0]  # the latents' batch
                  for kwargs in step.forwards)
    return StepSize(parameters=sum(p.numel() for p in step.model.parameters()), samples=samples, tokens=step.tokens,
                    calls=tuple(sorted(calls, key=lambda call: -call.calls)))


def _randn(*shape, device, dtype) -> torch.Tensor:
    return torch.randn(*shape, device=device).to(dtype)


def _cogvideox(tiny, latent, device, dtype) -> StepForwards:
    from diffusers import CogVideoXTransformer3DModel
    from diffusers.models.embeddings import get_3d_rotary_pos_embed

    from sagevideo.pipelines.cogvideox.tiny import TRANSFORMER_CONFIG as TINY

    frames, h, w = latent
    cfg = dict(TINY if tiny else COGVIDEOX_5B, sample_height=h, sample_width=w, sample_frames=(frames - 1) * 4 + 1)
    model = CogVideoXTransformer3DModel(**cfg)
    p = cfg["patch_size"]
    cos, sin = get_3d_rotary_pos_embed(cfg["attention_head_dim"], ((0, 0), (h // p, w // p)), (h // p, w // p),
                                       frames, device=device)
    kwargs = dict(
        hidden_states=_randn(2, frames, cfg["in_channels"], h, w, device=device, dtype=dtype),
        encoder_hidden_states=_randn(2, cfg["max_text_seq_length"], cfg["text_embed_dim"], device=device, dtype=dtype),
        timestep=torch.tensor([500, 500], device=device), image_rotary_emb=(cos, sin), return_dict=False,
    )
    return StepForwards("", model, [kwargs], list(model.transformer_blocks), frames * (h // p) * (w // p))


def _wan(tiny, latent, device, dtype) -> StepForwards:
    from diffusers import WanTransformer3DModel

    model = WanTransformer3DModel(**(WAN_TINY if tiny else {}))
    cfg = model.config
    frames, h, w = latent
    n_txt = 8 if tiny else 512
    hidden = _randn(1, cfg.in_channels, frames, h, w, device=device, dtype=dtype)
    forwards = [dict(hidden_states=hidden, timestep=torch.tensor([500], device=device), return_dict=False,
                     encoder_hidden_states=_randn(1, n_txt, cfg.text_dim, device=device, dtype=dtype))
                for _ in range(2)]  # conditional and unconditional branches: two calls a step
    return StepForwards("", model, forwards, list(model.blocks), frames * (h // 2) * (w // 2))


def _hunyuan(tiny, latent, device, dtype) -> StepForwards:
    from diffusers import HunyuanVideoTransformer3DModel

    from sagevideo.pipelines.hunyuanvideo.tiny import TRANSFORMER_CONFIG as TINY

    model = HunyuanVideoTransformer3DModel(**(TINY if tiny else {}))
    cfg = model.config
    frames, h, w = latent
    n_txt, real = (8, 5) if tiny else (256, 64)
    mask = torch.zeros(1, n_txt, device=device, dtype=torch.bool)
    mask[:, :real] = True
    kwargs = dict(
        hidden_states=_randn(1, cfg.in_channels, frames, h, w, device=device, dtype=dtype),
        timestep=torch.tensor([500], device=device),
        encoder_hidden_states=_randn(1, n_txt, cfg.text_embed_dim, device=device, dtype=dtype),
        encoder_attention_mask=mask,
        pooled_projections=_randn(1, cfg.pooled_projection_dim, device=device, dtype=dtype),
        guidance=torch.tensor([6000.0], device=device, dtype=dtype), return_dict=False,
    )
    blocks = list(model.transformer_blocks) + list(model.single_transformer_blocks)
    return StepForwards("", model, [kwargs], blocks, frames * (h // 2) * (w // 2))


def _opensora(tiny, latent, device, dtype) -> StepForwards:
    from sagevideo.pipelines.opensora import OpenSoraTransformer3DModel
    from sagevideo.pipelines.opensora.packing import latent_ids, text_ids

    model = OpenSoraTransformer3DModel(**(OPENSORA_TINY if tiny else {}))
    cfg = model.config
    frames, h, w = latent
    n_txt, batch = (8 if tiny else 512), 3  # conditional, text-unconditional, image-unconditional: one call
    ids = latent_ids(batch, frames, h, w, dtype=dtype, device=device)
    kwargs = dict(
        img=_randn(batch, ids.shape[1], cfg.in_channels, device=device, dtype=dtype), img_ids=ids,
        txt=_randn(batch, n_txt, cfg.context_in_dim, device=device, dtype=dtype),
        txt_ids=text_ids(batch, n_txt, dtype=dtype, device=device),
        timesteps=torch.full((batch,), 0.5, device=device, dtype=dtype),
        y_vec=_randn(batch, cfg.vec_in_dim, device=device, dtype=dtype),
        cond=torch.zeros(batch, ids.shape[1], cfg.cond_in_channels, device=device, dtype=dtype),
    )
    blocks = list(model.transformer_blocks) + list(model.single_transformer_blocks)
    return StepForwards("", model, [kwargs], blocks, ids.shape[1])
