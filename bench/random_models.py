"""Random-weight CogVideoX model folders that `sagevideo generate --model FOLDER` and diffusers'
`CogVideoXPipeline.from_pretrained(FOLDER)` both load (no download: sagevideo's byte-level
tokenizer, a small T5 of the real width).

The benchmarks that time whole videos write one with the transformer and VAE configs they
measure; text encoding runs once per video, so a 2-layer T5 of width 4096 (the real encoder's
output width) keeps the folder small without changing what is timed per step.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

T5 = dict(d_model=4096, d_kv=64, d_ff=1024, num_layers=2, num_heads=8, relative_attention_num_buckets=32,
          dropout_rate=0.0, feed_forward_proj="gated-gelu", pad_token_id=0, eos_token_id=1, decoder_start_token_id=0)


def write_cogvideox_folder(folder: Path, transformer: dict[str, Any], vae: dict[str, Any], *, device: str,
                           scheduler: Any = None) -> None:
    """Write a CogVideoX folder (safetensors, bf16) with random weights: the transformer and VAE
    built from these configs on `device` (random init of billions of weights is much faster on a
    GPU), seed 0. scheduler: a diffusers scheduler (default: the built-in tiny model's)."""
    import torch
    from diffusers import AutoencoderKLCogVideoX, CogVideoXPipeline, CogVideoXTransformer3DModel
    from transformers import T5Config, T5EncoderModel

    from sagevideo.pipelines.cogvideox.tiny import tiny_pipeline
    from sagevideo.pipelines.tiny import tiny_tokenizer

    tokenizer = tiny_tokenizer()  # byte-level, built in memory: saves and loads with no download
    torch.manual_seed(0)
    with torch.device(device):
        models = (CogVideoXTransformer3DModel(**transformer), AutoencoderKLCogVideoX(**vae),
                  T5EncoderModel(T5Config(vocab_size=len(tokenizer), **T5)))
    for module in models:  # bf16 on disk: half the bytes to write and load
        torch.nn.Module.to(module, dtype=torch.bfloat16)  # diffusers' own .to warns for every model
    model, autoencoder, text_encoder = models
    pipe = CogVideoXPipeline(tokenizer=tokenizer, text_encoder=text_encoder, vae=autoencoder, transformer=model,
                             scheduler=scheduler if scheduler is not None else tiny_pipeline().scheduler)
    pipe.to("cpu").save_pretrained(folder, safe_serialization=True)
    del pipe, models, model, autoencoder, text_encoder
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
