#!/usr/bin/env python3
"""On a GPU: the tiny CogVideoX pipeline with sagevideo installed (Triton, bf16) vs full precision.

Checks that the processor reaches the kernels inside a real diffusers pipeline, that every
attention call ran on Triton (recorded backends), and how far the quantized latents are from the
full-precision ones with the same seed. Prints one line per arm.

    python3 tools/gpu_pipeline_check.py
"""

from __future__ import annotations

import torch

from sagevideo import install, record_backends
from sagevideo.pipelines.cogvideox.tiny import tiny_pipeline

PROMPTS = ["a red fox running through snow", "a paper boat on a rainy street"]


def run(pipe, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator("cpu").manual_seed(seed)
    out = pipe(PROMPTS, num_frames=9, height=64, width=64, num_inference_steps=4, guidance_scale=6.0,
               generator=gen, output_type="latent")
    return out.frames.float()


def main() -> int:
    pipe = tiny_pipeline()
    torch.nn.Module.to(pipe.transformer, "cuda", torch.bfloat16)
    torch.nn.Module.to(pipe.text_encoder, "cuda", torch.bfloat16)
    torch.nn.Module.to(pipe.vae, "cuda", torch.bfloat16)
    pipe.set_progress_bar_config(disable=True)
    full = run(pipe)
    ok = torch.isfinite(full).all().item()
    print(f"full precision: latents {tuple(full.shape)} finite={ok}")
    for pv in ("fp16", "fp8"):
        with install(pipe, pv=pv, backend="triton"), record_backends() as log:
            quant = run(pipe)
        cos = torch.nn.functional.cosine_similarity(full.double().flatten(), quant.double().flatten(), dim=0).item()
        finite = torch.isfinite(quant).all().item()
        ok = ok and finite and set(log.counts) == {f"triton/{pv}"}
        print(f"sage pv={pv}: backends {log.counts}, latent cosine vs full {cos:.5f}, finite={finite}")
    again = run(pipe)
    restored = torch.equal(again, full)
    print(f"after remove(): bit-identical to full precision = {restored}")
    print("gpu_pipeline_check:", "OK" if ok and restored else "FAILED")
    return 0 if ok and restored else 1


if __name__ == "__main__":
    raise SystemExit(main())
