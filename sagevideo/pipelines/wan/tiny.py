"""The built-in tiny Wan models: diffusers Wan pipelines of the real architectures, built offline.

Every part is the diffusers/transformers class a real Wan checkpoint loads into (WanTransformer3DModel,
AutoencoderKLWan, UMT5EncoderModel, CLIPVisionModel, UniPCMultistepScheduler with flow sigmas as Wan
2.1 ships it), with a tiny config and random weights from a fixed seed, so `sagevideo generate --model
tiny-wan` runs anywhere with no download. The tokenizer is sagevideo's byte-level one (`pipelines.tiny`).

- `tiny-wan`: Wan 2.1 text-to-video (1.3B/14B layout), one transformer;
- `tiny-wan22`: Wan 2.2 A14B text-to-video, a second transformer (`transformer_2`, other weights)
  for the timesteps below `boundary_ratio` x 1000: with the default 2 steps, one step on each;
- `tiny-wan-i2v`: Wan 2.1 image-to-video (`WanImageToVideoPipeline`): the image's VAE latents and
  a mask join the noisy latents on the channel axis (16 + 4 + 16 = 36 input channels), and CLIP
  image embeddings are extra cross-attention keys (`added_kv_proj_dim`, `image_dim`);
- `tiny-wan22-ti2v`: Wan 2.2 TI2V-5B (`WanPipeline` with `expand_timesteps`, the Wan 2.2 VAE:
  16x spatial with its patchify, residual blocks): text-to-video, or image-to-video when a job
  gives an image (diffusers runs it through `WanImageToVideoPipeline` with `expand_timesteps`:
  the first latent frame is the image's, with per-token timesteps 0 there).

Attention has 2 heads of head dim 64 (a native head dim of the kernels), rotary embeddings and QK
norms as in Wan; each block has self-attention over the video tokens (`attn1`) and cross-attention
to the 512 umT5 text tokens (`attn2`).
Default video: 64x64 px, 9 frames -> latents (1, 16, 3, 8, 8) -> 48 video tokens (tiny-wan22-ti2v:
(1, 16, 3, 4, 4) -> 12).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

TINY_SEED = 0
TEXT_TOKENS = 512  # umT5's context in Wan (the pipeline pads every prompt to it)
DEFAULT_HEIGHT = 64
DEFAULT_WIDTH = 64
DEFAULT_FRAMES = 9
BOUNDARY_RATIO = 0.875  # Wan 2.2 A14B text-to-video's

TRANSFORMER_CONFIG = dict(
    patch_size=(1, 2, 2),
    num_attention_heads=2,
    attention_head_dim=64,
    in_channels=16,
    out_channels=16,
    text_dim=32,  # = T5_CONFIG["d_model"]
    freq_dim=256,
    ffn_dim=64,
    num_layers=2,
    cross_attn_norm=True,
    qk_norm="rms_norm_across_heads",
    eps=1e-6,
    rope_max_seq_len=1024,
)

# 4 stages -> 8x spatial compression; two temporal downsamples -> 4x (first frame on its own).
VAE_CONFIG = dict(
    base_dim=8,
    z_dim=16,
    dim_mult=[1, 1, 1, 1],
    num_res_blocks=1,
    attn_scales=[],
    temperal_downsample=[False, True, True],
    scale_factor_temporal=4,
    scale_factor_spatial=8,
)

T5_CONFIG = dict(
    d_model=32,
    d_kv=16,
    d_ff=64,
    num_layers=1,  # umT5 computes its relative position bias over 512 x 512 in every layer
    num_heads=2,
    relative_attention_num_buckets=8,
    dropout_rate=0.0,
    feed_forward_proj="gated-gelu",
    pad_token_id=0,
    eos_token_id=1,
    decoder_start_token_id=0,
)

# Wan 2.1 image-to-video: [noisy latents 16; mask 4 (one per frame the VAE folds into a latent
# frame); image latents 16], and cross-attention keys/values for CLIP's image tokens.
CLIP_CONFIG = dict(
    hidden_size=32,
    intermediate_size=37,
    num_hidden_layers=2,
    num_attention_heads=2,
    image_size=32,
    patch_size=8,  # (32 / 8)^2 + 1 = 17 image tokens (Wan 2.1: 257 from ViT-H/14 at 224 px)
    projection_dim=32,
)
CLIP_PROCESSOR_CONFIG = dict(size=CLIP_CONFIG["image_size"], crop_size=CLIP_CONFIG["image_size"])
I2V_TRANSFORMER_CONFIG = dict(
    TRANSFORMER_CONFIG,
    in_channels=16 + 4 + 16,
    image_dim=CLIP_CONFIG["hidden_size"],
    added_kv_proj_dim=TRANSFORMER_CONFIG["num_attention_heads"] * TRANSFORMER_CONFIG["attention_head_dim"],
)

# Wan 2.2's VAE as TI2V-5B has it: patchify 2 before 3 downsampling stages (16x spatial), residual
# shortcuts; 48 latent channels in the release, 16 here.
TI2V_VAE_CONFIG = dict(
    VAE_CONFIG,
    decoder_base_dim=8,
    is_residual=True,
    in_channels=12,
    out_channels=12,
    patch_size=2,
    scale_factor_spatial=16,
    latents_mean=[0.0] * 16,
    latents_std=[1.0] * 16,
)
TI2V_TRANSFORMER_CONFIG = dict(TRANSFORMER_CONFIG)

# Wan 2.1's scheduler in diffusers (flow matching, UniPC, shift 3.0 as for 480p).
SCHEDULER_CONFIG = dict(
    num_train_timesteps=1000,
    prediction_type="flow_prediction",
    use_flow_sigmas=True,
    flow_shift=3.0,
)


@dataclass(frozen=True)
class TinyWan:
    """One built-in tiny model. boundary_ratio: Wan 2.2 A14B's second transformer runs below it;
    expand_timesteps: Wan 2.2 TI2V-5B's per-token timesteps; image_encoder: Wan 2.1 I2V's CLIP;
    fps: the frame rate of its release (TI2V-5B: 24)."""

    pipeline_class: str
    transformer: dict[str, Any]
    vae: dict[str, Any]
    boundary_ratio: float | None = None
    expand_timesteps: bool = False
    image_encoder: bool = False
    fps: int = 16

    def index(self) -> dict[str, Any]:
        """What this model's `model_index.json` says (as `save_pretrained` writes it), components aside."""
        return {"_class_name": self.pipeline_class, "boundary_ratio": self.boundary_ratio,
                "expand_timesteps": self.expand_timesteps}


MODELS = {
    "tiny-wan": TinyWan("WanPipeline", TRANSFORMER_CONFIG, VAE_CONFIG),
    "tiny-wan22": TinyWan("WanPipeline", TRANSFORMER_CONFIG, VAE_CONFIG, boundary_ratio=BOUNDARY_RATIO),
    "tiny-wan-i2v": TinyWan("WanImageToVideoPipeline", I2V_TRANSFORMER_CONFIG, VAE_CONFIG, image_encoder=True),
    "tiny-wan22-ti2v": TinyWan("WanPipeline", TI2V_TRANSFORMER_CONFIG, TI2V_VAE_CONFIG, expand_timesteps=True,
                               fps=24),
}


def tiny_pipeline(name: str = "tiny-wan", seed: int = TINY_SEED):
    """Build the tiny Wan pipeline `name` (one of MODELS; fp32, CPU) with weights drawn from `seed`.

    The global torch RNG is left as it was; each component has its own derived seed, so changing
    one config does not change the weights of the others (tiny-wan22's `transformer` is tiny-wan's).
    """
    import diffusers
    import torch
    from diffusers import AutoencoderKLWan, UniPCMultistepScheduler, WanTransformer3DModel
    from transformers import UMT5Config, UMT5EncoderModel

    from sagevideo.pipelines.tiny import tiny_tokenizer

    if name not in MODELS:
        raise KeyError(f"no tiny Wan model {name!r}; built in: {sorted(MODELS)}")
    spec = MODELS[name]
    tokenizer = tiny_tokenizer()
    extra: dict[str, Any] = {}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        transformer = WanTransformer3DModel(**spec.transformer)
        torch.manual_seed(seed + 1)
        vae = AutoencoderKLWan(**spec.vae)
        torch.manual_seed(seed + 2)
        text_encoder = UMT5EncoderModel(UMT5Config(vocab_size=len(tokenizer), **T5_CONFIG))
        if spec.boundary_ratio is not None:
            torch.manual_seed(seed + 3)
            extra["transformer_2"] = WanTransformer3DModel(**spec.transformer)
        if spec.image_encoder:
            from transformers import CLIPImageProcessor, CLIPVisionConfig, CLIPVisionModel

            torch.manual_seed(seed + 4)
            extra["image_encoder"] = CLIPVisionModel(CLIPVisionConfig(**CLIP_CONFIG))
            extra["image_processor"] = CLIPImageProcessor(**CLIP_PROCESSOR_CONFIG)
    config = {k: v for k, v in (("boundary_ratio", spec.boundary_ratio), ("expand_timesteps", spec.expand_timesteps))
              if v}
    pipe = getattr(diffusers, spec.pipeline_class)(
        tokenizer=tokenizer, text_encoder=text_encoder, vae=vae, scheduler=UniPCMultistepScheduler(**SCHEDULER_CONFIG),
        transformer=transformer, **extra, **config,
    )
    for module in (transformer, vae, text_encoder, extra.get("transformer_2"), extra.get("image_encoder")):
        if module is not None:
            module.eval()  # built, not loaded: diffusers/transformers only call eval() in from_pretrained
    return pipe
