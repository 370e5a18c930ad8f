"""The built-in "tiny-hunyuanvideo" model: a HunyuanVideoPipeline of the real architecture, built offline.

Every part is the diffusers/transformers class a real HunyuanVideo folder loads into
(`HunyuanVideoTransformer3DModel`, `AutoencoderKLHunyuanVideo`, a Llama `LlamaModel` text encoder,
a `CLIPTextModel` for the pooled prompt, `FlowMatchEulerDiscreteScheduler`), with tiny configs and
random weights from a fixed seed, so `sagevideo generate --model tiny-hunyuanvideo` runs anywhere
with no download. As in the real model: 2 token-refiner layers (their attention has a text-only
query-and-key mask, which the kernels cannot take), dual-stream then single-stream blocks whose
attention gets the text key-padding mask, heads of dim 64 with rotary embedding (16 + 24 + 24 axes),
prompts padded to 256 Llama tokens after the prompt template (`prompts.PROMPT_TEMPLATE`).

Tokenizers are byte-level and built in memory: the Llama one knows Llama 3's header tokens, so the
prompt template tokenizes (and is cropped) as with the real tokenizer, only with more tokens.

Default video: 64x64 px, 9 frames -> latents (1, 4, 3, 8, 8) -> 48 video tokens + 256 text tokens.
"""

from __future__ import annotations

TINY_SEED = 0
TEXT_TOKENS = 256  # HunyuanVideoPipeline's max_sequence_length (Llama tokens after the template)
DEFAULT_HEIGHT = 64
DEFAULT_WIDTH = 64
DEFAULT_FRAMES = 9
DEFAULT_STEPS = 2

TRANSFORMER_CONFIG = dict(
    in_channels=4,
    out_channels=4,
    num_attention_heads=2,
    attention_head_dim=64,  # a native head dim of the kernels
    num_layers=2,
    num_single_layers=2,
    num_refiner_layers=2,
    mlp_ratio=2.0,
    patch_size=2,
    patch_size_t=1,
    qk_norm="rms_norm",
    guidance_embeds=True,
    text_embed_dim=32,  # = the Llama's hidden size
    pooled_projection_dim=32,  # = the CLIP's hidden size
    rope_theta=256.0,
    rope_axes_dim=(16, 24, 24),  # sums to the head dim
)

# As in diffusers' own HunyuanVideo test config: 4 blocks -> 8x spatial, 4x temporal compression.
VAE_CONFIG = dict(
    in_channels=3,
    out_channels=3,
    latent_channels=4,
    down_block_types=("HunyuanVideoDownBlock3D",) * 4,
    up_block_types=("HunyuanVideoUpBlock3D",) * 4,
    block_out_channels=(8, 8, 8, 8),
    layers_per_block=1,
    act_fn="silu",
    norm_num_groups=4,
    scaling_factor=0.476986,
    spatial_compression_ratio=8,
    temporal_compression_ratio=4,
    mid_block_add_attention=True,
)

LLAMA_CONFIG = dict(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=3,  # the pipeline reads the hidden states 2 layers before the last
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=2048,  # template (~590 byte tokens) + 256 prompt tokens
)

CLIP_CONFIG = dict(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    max_position_embeddings=77,
    projection_dim=32,
)

SCHEDULER_CONFIG = dict(shift=7.0)  # HunyuanVideo's flow-matching shift

# Llama 3's special tokens that HunyuanVideo's prompt template uses, one token each as in Llama 3.
LLAMA_SPECIALS = ("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>")
_BYTE_SPECIALS = ("<pad>", "</s>", "<unk>")  # ids 0, 1, 2 (as the shared tiny tokenizer)


def tiny_llama_tokenizer():
    """A byte-level tokenizer with Llama 3's header tokens: `<|begin_of_text|>` first, then one token
    per UTF-8 byte; pads with `<pad>` (id 0)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {tok: i for i, tok in enumerate((*_BYTE_SPECIALS, *LLAMA_SPECIALS, *alphabet))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in (*_BYTE_SPECIALS, *LLAMA_SPECIALS)])
    bos = LLAMA_SPECIALS[0]
    tok.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A $B", special_tokens=[(bos, vocab[bos])]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=bos, eos_token="<|eot_id|>", pad_token="<pad>", unk_token="<unk>"
    )


def tiny_pipeline(seed: int = TINY_SEED):
    """Build the tiny HunyuanVideoPipeline (fp32, CPU) with weights drawn from `seed`.

    The global torch RNG is left as it was; each component has its own derived seed.
    """
    import torch
    from diffusers import (
        AutoencoderKLHunyuanVideo,
        FlowMatchEulerDiscreteScheduler,
        HunyuanVideoPipeline,
        HunyuanVideoTransformer3DModel,
    )
    from transformers import CLIPTextConfig, CLIPTextModel, LlamaConfig, LlamaModel

    from sagevideo.pipelines.tiny import tiny_tokenizer

    tokenizer, tokenizer_2 = tiny_llama_tokenizer(), tiny_tokenizer()
    llama = LlamaConfig(
        vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, **LLAMA_CONFIG,
    )
    # eos_token_id: CLIP pools at the first </s> (the byte tokenizer ends every prompt with it).
    clip = CLIPTextConfig(
        vocab_size=len(tokenizer_2), pad_token_id=tokenizer_2.pad_token_id, eos_token_id=tokenizer_2.eos_token_id,
        bos_token_id=tokenizer_2.eos_token_id, **CLIP_CONFIG,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        transformer = HunyuanVideoTransformer3DModel(**TRANSFORMER_CONFIG)
        torch.manual_seed(seed + 1)
        vae = AutoencoderKLHunyuanVideo(**VAE_CONFIG)
        torch.manual_seed(seed + 2)
        text_encoder = LlamaModel(llama)
        torch.manual_seed(seed + 3)
        text_encoder_2 = CLIPTextModel(clip)
    pipe = HunyuanVideoPipeline(
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        transformer=transformer,
        vae=vae,
        scheduler=FlowMatchEulerDiscreteScheduler(**SCHEDULER_CONFIG),
        text_encoder_2=text_encoder_2,
        tokenizer_2=tokenizer_2,
    )
    for module in (transformer, vae, text_encoder, text_encoder_2):
        module.eval()  # built, not loaded: diffusers/transformers only call eval() in from_pretrained
    return pipe
