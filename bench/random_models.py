"""Random-weight CogVideoX and Wan model folders that `sagevideo generate --model FOLDER` and
diffusers' `DiffusionPipeline.from_pretrained(FOLDER)` both load (no download: sagevideo's
byte-level tokenizer, a small T5/umT5 of the real width).

The benchmarks that time whole videos write one with the transformer and VAE configs they
measure; text encoding runs once per video, so a 2-layer text encoder of width 4096 (the real
encoders' output width) keeps the folder small without changing what is timed per step.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

T5 = dict(d_model=4096, d_kv=64, d_ff=1024, num_layers=2, num_heads=8, relative_attention_num_buckets=32,
          dropout_rate=0.0, feed_forward_proj="gated-gelu", pad_token_id=0, eos_token_id=1, decoder_start_token_id=0)
# Wan 2.1's scheduler at 720p in diffusers: flow matching, UniPC, shift 5.0 (3.0 is for 480p).
WAN_720P_SCHEDULER = dict(num_train_timesteps=1000, prediction_type="flow_prediction", use_flow_sigmas=True,
                          flow_shift=5.0)


def write_cogvideox_folder(folder: Path, transformer: dict[str, Any], vae: dict[str, Any], *, device: str,
                           scheduler: Any = None) -> None:
    """Write a CogVideoX folder (safetensors, bf16) with random weights: the transformer and VAE
    built from these configs on `device` (random init of billions of weights is much faster on a
    GPU), seed 0. scheduler: a diffusers scheduler (default: the built-in tiny model's)."""
    from diffusers import AutoencoderKLCogVideoX, CogVideoXPipeline, CogVideoXTransformer3DModel
    from transformers import T5Config, T5EncoderModel

    from sagevideo.pipelines.cogvideox.tiny import tiny_pipeline

    _write_folder(folder, CogVideoXPipeline, device,
                  lambda vocab: (CogVideoXTransformer3DModel(**transformer), AutoencoderKLCogVideoX(**vae),
                                 T5EncoderModel(T5Config(vocab_size=vocab, **T5))),
                  scheduler if scheduler is not None else tiny_pipeline().scheduler)


def write_wan_folder(folder: Path, transformer: dict[str, Any], vae: dict[str, Any], *, device: str,
                     scheduler: Any = None) -> None:
    """Write a Wan 2.1 text-to-video folder (safetensors, bf16) with random weights, as
    `write_cogvideox_folder` does: `WanTransformer3DModel(**transformer)` (empty: the 14B's config),
    `AutoencoderKLWan(**vae)` (empty: Wan 2.1's VAE), a 2-layer umT5 of width 4096. scheduler:
    default UniPC with flow sigmas at 720p's shift (`WAN_720P_SCHEDULER`)."""
    from diffusers import AutoencoderKLWan, UniPCMultistepScheduler, WanPipeline, WanTransformer3DModel
    from transformers import UMT5Config, UMT5EncoderModel

    _write_folder(folder, WanPipeline, device,
                  lambda vocab: (WanTransformer3DModel(**transformer), AutoencoderKLWan(**vae),
                                 UMT5EncoderModel(UMT5Config(vocab_size=vocab, **T5))),
                  scheduler if scheduler is not None else UniPCMultistepScheduler(**WAN_720P_SCHEDULER))


def _write_folder(folder: Path, pipeline_class: Any, device: str, build, scheduler: Any) -> None:
    """`build(vocab_size)` -> (transformer, vae, text encoder), built on `device` from seed 0, cast
    to bf16 and saved with sagevideo's byte-level tokenizer and `scheduler` as `pipeline_class`."""
    import torch

    from sagevideo.pipelines.tiny import tiny_tokenizer

    tokenizer = tiny_tokenizer()  # byte-level, built in memory: saves and loads with no download
    torch.manual_seed(0)
    with torch.device(device):
        models = build(len(tokenizer))
    for module in models:  # bf16 on disk: half the bytes to write and load
        torch.nn.Module.to(module, dtype=torch.bfloat16)  # diffusers' own .to warns for every model
    model, autoencoder, text_encoder = models
    pipe = pipeline_class(tokenizer=tokenizer, text_encoder=text_encoder, vae=autoencoder, transformer=model,
                          scheduler=scheduler)
    pipe.to("cpu").save_pretrained(folder, safe_serialization=True)
    del pipe, models, model, autoencoder, text_encoder
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
