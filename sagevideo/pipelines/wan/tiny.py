"""The built-in tiny Wan models: `WanPipeline`s of the real architecture, built offline.

Every part is the diffusers/transformers class a real Wan checkpoint loads into (WanTransformer3DModel,
AutoencoderKLWan, UMT5EncoderModel, UniPCMultistepScheduler with flow sigmas as Wan 2.1 ships it),
with a tiny config and random weights from a fixed seed, so `sagevideo generate --model tiny-wan`
runs anywhere with no download. The tokenizer is sagevideo's byte-level one (`pipelines.tiny`).

- `tiny-wan`: Wan 2.1's layout, one transformer;
- `tiny-wan22`: Wan 2.2 A14B's, a second transformer (`transformer_2`, other weights) for the
  timesteps below `boundary_ratio` x 1000: with the default 2 steps, one step on each.

Attention has 2 heads of head dim 64 (a native head dim of the kernels), rotary embeddings and QK
norms as in Wan; each block has self-attention over the video tokens (`attn1`) and cross-attention
to the 512 umT5 text tokens (`attn2`).
Default video: 64x64 px, 9 frames -> latents (1, 16, 3, 8, 8) -> 48 video tokens.
"""

from __future__ import annotations

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
    num_layers=2,
    num_heads=2,
    relative_attention_num_buckets=8,
    dropout_rate=0.0,
    feed_forward_proj="gated-gelu",
    pad_token_id=0,
    eos_token_id=1,
    decoder_start_token_id=0,
)

# Wan 2.1's scheduler in diffusers (flow matching, UniPC, shift 3.0 as for 480p).
SCHEDULER_CONFIG = dict(
    num_train_timesteps=1000,
    prediction_type="flow_prediction",
    use_flow_sigmas=True,
    flow_shift=3.0,
)

TINY_MODELS = {"tiny-wan": None, "tiny-wan22": BOUNDARY_RATIO}  # name -> boundary_ratio


def tiny_pipeline(name: str = "tiny-wan", seed: int = TINY_SEED):
    """Build the tiny WanPipeline `name` (fp32, CPU) with weights drawn from `seed`.

    The global torch RNG is left as it was; each component has its own derived seed, so changing
    one config does not change the weights of the others (and tiny-wan22's `transformer` is
    tiny-wan's).
    """
    import torch
    from diffusers import AutoencoderKLWan, UniPCMultistepScheduler, WanPipeline, WanTransformer3DModel
    from transformers import UMT5Config, UMT5EncoderModel

    from sagevideo.pipelines.tiny import tiny_tokenizer

    if name not in TINY_MODELS:
        raise KeyError(f"no tiny Wan model {name!r}; built in: {sorted(TINY_MODELS)}")
    boundary_ratio = TINY_MODELS[name]
    tokenizer = tiny_tokenizer()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        transformer = WanTransformer3DModel(**TRANSFORMER_CONFIG)
        torch.manual_seed(seed + 1)
        vae = AutoencoderKLWan(**VAE_CONFIG)
        torch.manual_seed(seed + 2)
        text_encoder = UMT5EncoderModel(UMT5Config(vocab_size=len(tokenizer), **T5_CONFIG))
        transformer_2 = None
        if boundary_ratio is not None:
            torch.manual_seed(seed + 3)
            transformer_2 = WanTransformer3DModel(**TRANSFORMER_CONFIG)
    pipe = WanPipeline(
        tokenizer=tokenizer, text_encoder=text_encoder, vae=vae, scheduler=UniPCMultistepScheduler(**SCHEDULER_CONFIG),
        transformer=transformer, transformer_2=transformer_2, boundary_ratio=boundary_ratio,
    )
    for module in (transformer, transformer_2, vae, text_encoder):
        if module is not None:
            module.eval()  # built, not loaded: diffusers/transformers only call eval() in from_pretrained
    return pipe
