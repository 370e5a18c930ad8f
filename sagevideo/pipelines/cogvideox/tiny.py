"""The built-in tiny CogVideoX models, of the real architecture, built offline: "tiny" (a
CogVideoXPipeline) and "tiny-cogvideox-i2v" (a CogVideoXImageToVideoPipeline).

Every part is the diffusers/transformers class a real CogVideoX checkpoint loads into, with a tiny
config and random weights from a fixed seed, so `sagevideo generate` runs anywhere with no
download. Attention has 2 heads of head dim 64 (a native head dim of the kernels) and rotary
embeddings (as in CogVideoX-5B), so the installed processor exercises the same code path.

Default video: 64x64 px, 9 frames -> latents (1, 3, 4, 8, 8) -> 48 video tokens + 226 text tokens.

The image-to-video transformer is the text-to-video one with what CogVideoX1.5-5B-I2V adds (as in
diffusers' own i2v test config, in_channels doubled): the pipeline encodes the image with the VAE
and concatenates its latents to the noisy latents on the channel axis, and an `ofs` embedding
(ofs_embed_dim = time_embed_dim) joins the time embedding. Its VAE and text encoder are the
text-to-video model's, with the same weights.
"""

from __future__ import annotations

TINY_SEED = 0
TEXT_TOKENS = 226  # as CogVideoX: prompts are cut after 225 bytes (+ </s>), with diffusers' warning
DEFAULT_HEIGHT = 64
DEFAULT_WIDTH = 64
DEFAULT_FRAMES = 9

TRANSFORMER_CONFIG = dict(
    num_attention_heads=2,
    attention_head_dim=64,
    in_channels=4,
    out_channels=4,
    time_embed_dim=32,
    text_embed_dim=32,
    num_layers=2,
    sample_width=DEFAULT_WIDTH // 8,  # latent size; the VAE compresses 8x spatially
    sample_height=DEFAULT_HEIGHT // 8,
    sample_frames=DEFAULT_FRAMES,
    patch_size=2,
    temporal_compression_ratio=4,
    max_text_seq_length=TEXT_TOKENS,
    use_rotary_positional_embeddings=True,
)

I2V_NAME = "tiny-cogvideox-i2v"
I2V_TRANSFORMER_CONFIG = dict(
    TRANSFORMER_CONFIG,
    in_channels=2 * TRANSFORMER_CONFIG["in_channels"],  # [noisy latents; image latents]
    ofs_embed_dim=TRANSFORMER_CONFIG["time_embed_dim"],
)
# Built-in name -> (pipeline class, transformer config).
MODELS = {
    "tiny": ("CogVideoXPipeline", TRANSFORMER_CONFIG),
    I2V_NAME: ("CogVideoXImageToVideoPipeline", I2V_TRANSFORMER_CONFIG),
}

# As in diffusers' own CogVideoX test config: 4 blocks -> 8x spatial, 4x temporal compression.
VAE_CONFIG = dict(
    in_channels=3,
    out_channels=3,
    down_block_types=("CogVideoXDownBlock3D",) * 4,
    up_block_types=("CogVideoXUpBlock3D",) * 4,
    block_out_channels=(8, 8, 8, 8),
    latent_channels=4,
    layers_per_block=1,
    norm_num_groups=2,
    temporal_compression_ratio=4,
)

T5_CONFIG = dict(
    d_model=32,  # = TRANSFORMER_CONFIG["text_embed_dim"]
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


def tiny_pipeline(seed: int = TINY_SEED, name: str = "tiny"):
    """Build the tiny CogVideoX pipeline `name` ("tiny" or "tiny-cogvideox-i2v"; fp32, CPU) with
    weights drawn from `seed`.

    The global torch RNG is left as it was; each component has its own derived seed so that
    changing one config does not change the weights of the others.
    """
    import diffusers
    import torch
    from diffusers import AutoencoderKLCogVideoX, CogVideoXDDIMScheduler, CogVideoXTransformer3DModel
    from transformers import T5Config, T5EncoderModel

    from sagevideo.pipelines.tiny import tiny_tokenizer

    pipeline_class, transformer_config = MODELS[name]
    tokenizer = tiny_tokenizer()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        transformer = CogVideoXTransformer3DModel(**transformer_config)
        torch.manual_seed(seed + 1)
        vae = AutoencoderKLCogVideoX(**VAE_CONFIG)
        torch.manual_seed(seed + 2)
        text_encoder = T5EncoderModel(T5Config(vocab_size=len(tokenizer), **T5_CONFIG))
    # CogVideoX-2B's scheduler settings (v-prediction, zero-SNR, trailing timesteps).
    scheduler = CogVideoXDDIMScheduler(
        beta_schedule="scaled_linear",
        beta_start=0.00085,
        beta_end=0.012,
        clip_sample=False,
        prediction_type="v_prediction",
        rescale_betas_zero_snr=True,
        set_alpha_to_one=True,
        snr_shift_scale=3.0,
        timestep_spacing="trailing",
    )
    pipe = getattr(diffusers, pipeline_class)(
        tokenizer=tokenizer, text_encoder=text_encoder, vae=vae, transformer=transformer, scheduler=scheduler
    )
    for module in (transformer, vae, text_encoder):
        module.eval()  # built, not loaded: diffusers/transformers only call eval() in from_pretrained
    return pipe
