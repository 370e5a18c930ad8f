"""Estimate a job's peak memory and attention time before it starts, from the model's configs.

The memory model has three parts, of which the largest counts (they do not overlap in time):
the weights in the run's dtype (from the safetensors headers, no data read), denoising (the
transformer's activations, ~16 values per token and channel, plus the attention backend's
transient: the PyTorch emulation holds B·H·N·block_n scores per key tile; SDPA and the Triton
kernels need O(N)), and decoding (the VAE at full resolution: about 26 activations of
H·W·C for one frame, ~15 more per frame up to 9 frames and ~6.5 after, as measured on the built-in
tiny CogVideoX on CPU; real VAEs have more channels at lower resolutions, so this is a floor).
Figures are estimates (within ~50% on the tiny model); a job is refused only when its estimate
exceeds what the device has free.

The attention time is measured, not guessed: one call of the job's backend at 1,024 tokens on
this machine, scaled by N² (attention dominates at the sizes where a run takes hours).
`attention_call_seconds` (any shape, from one head measured) and `matmul_flops` serve the same
estimates for `profile` and the benches (`experiments.run_budget`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from sagevideo.generation.budget import format_bytes, format_seconds
from sagevideo.jobs.specs import JobSpec
from sagevideo.pipelines.loading import ModelSource

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
ACTIVATIONS_PER_CHANNEL = 16  # transformer: q, k, v, out, 4x FFN, norms, residuals (fp32 or bf16)
_PROBE_TOKENS = 1024
# Below this many tokens per attention call a job is quick enough not to need a time estimate.
TIME_ESTIMATE_FROM_TOKENS = 16384
OVERHEAD_BYTES = 300 * 10**6  # text encoder activations, scheduler, frame buffers, allocator slack
_SDPA_BACKENDS = {"cudnn": "CUDNN_ATTENTION", "flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION",
                  "math": "MATH"}


@dataclass(frozen=True)
class JobEstimate:
    """One job's estimate: tokens per attention call, bytes of each phase, attention seconds (None
    when not measured: small jobs, or a GPU)."""

    tokens: int
    weights: int
    denoise: int
    decode: int
    attention_s: float | None = None
    calls: int = 0

    @property
    def peak(self) -> int:
        return self.weights + max(self.denoise, self.decode) + OVERHEAD_BYTES

    def describe(self) -> str:
        phase = "decoding the video" if self.decode >= self.denoise else "denoising"
        return (
            f"about {format_bytes(self.peak)} at its peak ({phase}; weights {format_bytes(self.weights)}, "
            f"{self.tokens:,} tokens per attention call)"
        )


def latent_tokens(source: ModelSource, job: JobSpec) -> int:
    """Tokens of the longest attention call of a resolved job, as its family counts them (joint
    text included where the model attends over [text; video], as CogVideoX does; Wan's text is
    only in cross-attention)."""
    return source.model_family.attention_tokens(source, job)


def decode_activations(frames: int) -> float:
    """Full-resolution VAE activations alive at the decoder's peak, in frames' worth (see module doc)."""
    return 26 + 15 * min(frames - 1, 8) + 6.5 * max(0, frames - 9)


def estimate_job(source: ModelSource, job: JobSpec, backend: str | None, dtype: str,
                 recipe: Any = None) -> JobEstimate:
    """Peak memory of a resolved job; backend: its sageattn backend (None: full precision, SDPA);
    recipe: the batch's `Recipe` (its weights: `weights_bytes`)."""
    width = DTYPE_BYTES[dtype]
    batch = source.model_family.forward_batch(source, job)  # e.g. CFG's two halves in one call
    tokens = latent_tokens(source, job)
    inner = source.heads * source.head_dim
    denoise = batch * tokens * inner * width * ACTIVATIONS_PER_CHANNEL
    if backend == "reference":
        denoise += reference_transient_bytes(batch, source.heads, tokens, source.head_dim, job.pv or "fp16")
    decode = int(job.height * job.width * source.vae_channels * width * decode_activations(job.frames))
    return JobEstimate(tokens=tokens, weights=weights_bytes(source, dtype, recipe), denoise=denoise, decode=decode,
                       calls=source.layers * job.steps)


def reference_transient_bytes(batch: int, heads: int, tokens: int, head_dim: int, pv: str) -> int:
    """Bytes the PyTorch emulation of the kernels (`backend="reference"`) holds during one attention
    call: fp64/fp32 score tiles of block_n keys per query and fp32/fp64 copies of Q, K, V."""
    from sagevideo.kernels.plans import tiles

    block_n = tiles(pv, head_dim)[1]
    return batch * heads * tokens * (block_n * 40 + head_dim * 40)


def weights_bytes(source: ModelSource, dtype: str, recipe: Any = None) -> int:
    """Bytes of the pipeline's weights once loaded in `dtype` (tiny: its parameter count). With
    FP8 linears and bf16 steps the denoisers' matrices are held twice: bf16 and a float8 copy
    (1 byte an element). Plain FP8 linears are counted in bf16: an estimate above the truth."""
    width = DTYPE_BYTES[dtype]
    if source.is_tiny:
        return 10 * 10**6  # a few hundred thousand parameters; this bounds them
    total = _stored_elements(str(source.path)) * width
    if recipe is not None and recipe.linear == "fp8" and recipe.linear_bf16_steps:
        total += _stored_denoiser_matrices(str(source.path))
    return total


def _stored_denoiser_matrices(folder: str) -> int:
    """Elements of the 2-D weights in a diffusers folder's denoiser subfolders (transformer,
    transformer_2): the linears FP8 quantizes, and a few embeddings (headers only, each subfolder's
    count cached by `_stored_elements`)."""
    return sum(_stored_elements(str(sub), matrices_only=True)
               for sub in sorted(Path(folder).glob("transformer*")) if sub.is_dir())


@lru_cache(maxsize=8)
def _stored_elements(folder: str, matrices_only: bool = False) -> int:
    """Number of weight elements in a diffusers folder's safetensors files (headers only)."""
    from safetensors import safe_open

    total = 0
    for file in sorted(Path(folder).rglob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            for key in f.keys():
                shape = f.get_slice(key).get_shape()
                if matrices_only and len(shape) != 2:
                    continue
                n = 1
                for dim in shape:
                    n *= dim
                total += n
    return total


def attention_seconds(source: ModelSource, job: JobSpec, backend: str | None, device: str, dtype: str) -> float:
    """Seconds of attention for the whole job: one measured call at 1,024 tokens scaled by N²."""
    batch = source.model_family.forward_batch(source, job)
    per_call = _probe_call(backend, device, dtype, batch, source.heads, source.head_dim, job.pv or "fp16")
    scale = (latent_tokens(source, job) / _PROBE_TOKENS) ** 2
    return per_call * scale * source.layers * job.steps


def attention_call_seconds(backend: str | None, device: str, dtype: str, batch: int, heads: int, n_q: int,
                           n_k: int, head_dim: int, pv: str = "fp16", sdpa: str | None = None) -> float:
    """Seconds of one attention call q (batch, heads, n_q, head_dim), k/v (.., n_k, ..) here: one
    head at 1,024 tokens measured (`backend`: sageattn's; None: SDPA, pinned to backend `sdpa`
    when given, e.g. "math"), scaled by batch·heads·n_q·n_k (the work of one call grows so)."""
    per_head = _probe_call(backend, device, dtype, 1, 1, head_dim, pv, sdpa)
    return per_head * batch * heads * (n_q / _PROBE_TOKENS) * (n_k / _PROBE_TOKENS)


@lru_cache(maxsize=8)
def matmul_flops(device: str, dtype: str) -> float:
    """Multiply-adds x 2 per second of a 1024x1024 matmul here (best of two, after a warm-up)."""
    import torch

    a, b = (torch.randn(1024, 1024, device=device).to(getattr(torch, dtype)) for _ in range(2))
    best = float("inf")
    for i in range(3):
        start = time.perf_counter()
        a @ b
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        if i:
            best = min(best, time.perf_counter() - start)
    return 2 * 1024**3 / best


@lru_cache(maxsize=16)
def _probe_call(backend: str | None, device: str, dtype: str, batch: int, heads: int, head_dim: int, pv: str,
                sdpa: str | None = None) -> float:
    """Seconds of one attention call of this backend at 1,024 tokens here (best of two, after a
    warm-up; one when it takes half a second); backend None: SDPA (pinned to backend `sdpa`, e.g.
    "math", when given)."""
    import contextlib

    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from sagevideo.attention.functional import sageattn

    generator = torch.Generator().manual_seed(0)
    shape = (batch, heads, _PROBE_TOKENS, head_dim)
    q, k, v = (torch.randn(shape, generator=generator).to(device=device, dtype=getattr(torch, dtype))
               for _ in range(3))
    def pinned():
        return sdpa_kernel([getattr(SDPBackend, _SDPA_BACKENDS[sdpa])]) if sdpa else contextlib.nullcontext()

    def call():
        if backend is None:
            with pinned():
                F.scaled_dot_product_attention(q, k, v)
        else:
            sageattn(q, k, v, pv=pv, backend=backend)
        if device == "cuda":
            torch.cuda.synchronize()

    best = float("inf")
    with torch.no_grad():
        call()
        for _ in range(2):
            start = time.perf_counter()
            call()
            best = min(best, time.perf_counter() - start)
            if best > 0.5:  # slow enough that timer noise does not matter: one timed call will do
                break
    return best


def time_note(label: str, estimate: JobEstimate, backend: str | None, device: str, timeout: float | None) -> str:
    """A note that a job will take long, with the estimate and what it is based on."""
    line = (
        f"{label}: attention alone needs about {format_seconds(estimate.attention_s)} here "
        f"({estimate.tokens:,} tokens per call, {estimate.calls} calls; backend {backend or 'sdpa'} on {device}, "
        f"measured at {_PROBE_TOKENS:,} tokens and scaled by N²); the progress bar moves once per denoising step"
    )
    if timeout is not None and estimate.attention_s > timeout:
        line += f"; it will run past --job-timeout {timeout:g} s"
    return line
