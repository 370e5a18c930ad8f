"""The built-in "tiny-opensora" model: an `OpenSoraPipeline` of the real architecture, built offline.

Every part is the class a converted Open-Sora 2.0 folder loads into (`OpenSoraTransformer3DModel`,
diffusers' `AutoencoderKLHunyuanVideo`, transformers' `T5EncoderModel` and `CLIPTextModel`,
`FlowMatchEulerDiscreteScheduler`), with tiny configs and random weights from a fixed seed, and
byte-level tokenizers built in memory (`sagevideo.pipelines.tiny.tiny_tokenizer`), so
`sagevideo generate --model tiny-opensora` runs anywhere with no download.

What it keeps of the real model: 16 latent channels, the VAE's 8x space / 4x time compression,
patch 2, prompts padded to 512 T5 tokens, one double-stream and one single-stream block (both
attention kinds), head dim 64 (a native head dim of the kernels), the 1 + 4k frames rule. It is not
the released architecture, so the official aspect table does not bind it (any multiple of 16).
Default video: 112x64 px (16:9-ish), 9 frames -> latents (1, 16, 3, 8, 14) -> 84 image tokens
+ 512 text tokens per attention call, 2 steps.
"""

from __future__ import annotations

TINY_SEED = 0
TEXT_TOKENS = 512  # T5, as the real model
DEFAULT_HEIGHT, DEFAULT_WIDTH = 64, 112  # small: the VAE decode dominates a tiny job on CPU
DEFAULT_FRAMES = 9
DEFAULT_STEPS = 2

T5_CONFIG = dict(
    d_model=32, d_kv=16, d_ff=64, num_layers=1, num_heads=2, relative_attention_num_buckets=8, dropout_rate=0.0,
    feed_forward_proj="gated-gelu", pad_token_id=0, eos_token_id=1, decoder_start_token_id=0,
)
CLIP_CONFIG = dict(
    hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, max_position_embeddings=77,
    pad_token_id=0, bos_token_id=0, eos_token_id=1,  # the byte tokenizer ends every prompt with </s> (id 1)
)
TRANSFORMER_CONFIG = dict(
    in_channels=64,  # 16 latent channels x 2x2 patch
    patch_size=2,
    vec_in_dim=CLIP_CONFIG["hidden_size"],
    context_in_dim=T5_CONFIG["d_model"],
    hidden_size=128,
    num_heads=2,  # head dim 64
    depth=1,
    depth_single_blocks=1,
    mlp_ratio=4.0,
    axes_dim=(16, 24, 24),  # (t, h, w), summing to the head dim
    theta=10000,
    cond_in_channels=68,  # (mask + 16 latent channels) x 2x2 patch
)
# HunyuanVideo's VAE layout (4 blocks: 8x space, 4x time, 16 latent channels), 8 channels wide.
VAE_CONFIG = dict(block_out_channels=(8, 8, 8, 8), layers_per_block=1, norm_num_groups=4, latent_channels=16)


def tiny_pipeline(seed: int = TINY_SEED):
    """Build the tiny OpenSoraPipeline (fp32, CPU, eval mode) with weights drawn from `seed`.

    The global torch RNG is left as it was; each component has its own derived seed, so that
    changing one config does not change the others' weights.
    """
    import torch
    from diffusers import AutoencoderKLHunyuanVideo, FlowMatchEulerDiscreteScheduler
    from transformers import CLIPTextConfig, CLIPTextModel, T5Config, T5EncoderModel

    from sagevideo.pipelines.opensora.pipeline import OpenSoraPipeline
    from sagevideo.pipelines.opensora.transformer import OpenSoraTransformer3DModel
    from sagevideo.pipelines.tiny import tiny_tokenizer

    tokenizer, tokenizer_2 = tiny_tokenizer(), tiny_tokenizer()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        transformer = OpenSoraTransformer3DModel(**TRANSFORMER_CONFIG)
        torch.manual_seed(seed + 1)
        vae = AutoencoderKLHunyuanVideo(**VAE_CONFIG)
        torch.manual_seed(seed + 2)
        text_encoder = T5EncoderModel(T5Config(vocab_size=len(tokenizer), **T5_CONFIG))
        torch.manual_seed(seed + 3)
        text_encoder_2 = CLIPTextModel(CLIPTextConfig(vocab_size=len(tokenizer_2), **CLIP_CONFIG))
    pipe = OpenSoraPipeline(
        tokenizer=tokenizer, text_encoder=text_encoder, tokenizer_2=tokenizer_2, text_encoder_2=text_encoder_2,
        vae=vae, transformer=transformer, scheduler=FlowMatchEulerDiscreteScheduler(),
    )
    for module in (transformer, vae, text_encoder, text_encoder_2):
        module.eval()  # built, not loaded: only from_pretrained calls eval()
    return pipe
