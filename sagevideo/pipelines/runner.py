"""Run one generation job on a loaded CogVideoX pipeline and return checked uint8 frames.

Denoising and decoding are timed separately: the pipeline runs with output_type="latent", then
the latents are decoded here, so decoded frames can be checked for NaN/Inf *before*
post-processing clamps Inf away. Latents are checked after every denoising step, so a failure
names the step where it first appeared.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from sagevideo.jobs.specs import JobSpec


class NonFiniteError(RuntimeError):
    """NaN or Inf in latents or decoded frames."""


@dataclass
class JobFrames:
    """frames: (F, H, W, 3) uint8 RGB; timings in seconds."""

    frames: np.ndarray
    denoise_s: float
    decode_s: float


def run_job(
    pipe, job: JobSpec, *, text_tokens: int, on_step: Callable[[int, int], None] | None = None
) -> JobFrames:
    """Generate one video. `job` must have height/width/frames/steps resolved (ModelSource.resolve).

    on_step(step, steps) is called after each denoising step (1-based), once its latents are
    known to be finite; an exception it raises stops the job.

    The initial noise comes from a CPU generator seeded with job.seed, so a seed gives the same
    noise on every device (paired A/B runs rely on it).
    """
    device = pipe.transformer.device
    generator = torch.Generator("cpu").manual_seed(job.seed)

    def check_step(pipeline, step: int, timestep, tensors: dict) -> dict:
        if not torch.isfinite(tensors["latents"]).all():
            raise NonFiniteError(
                f"NaN/Inf in the latents after denoising step {step + 1}/{job.steps} "
                f"(timestep {int(timestep)})"
            )
        if on_step is not None:
            on_step(step + 1, job.steps)
        return tensors

    start = _now(device)
    (latents,) = pipe(
        prompt=job.prompt,
        negative_prompt=job.negative_prompt or None,
        height=job.height,
        width=job.width,
        num_frames=job.frames,
        num_inference_steps=job.steps,
        guidance_scale=job.guidance,
        generator=generator,
        output_type="latent",
        return_dict=False,
        callback_on_step_end=check_step,
        callback_on_step_end_tensor_inputs=["latents"],
        max_sequence_length=text_tokens,
    )
    denoised = _now(device)

    # CogVideoX 1.5 pads latent frames to a multiple of patch_size_t; the pipeline drops the
    # padding only when it decodes, so do the same here.
    patch_t = pipe.transformer.config.patch_size_t
    latent_frames = (job.frames - 1) // pipe.vae_scale_factor_temporal + 1
    if patch_t is not None and latent_frames % patch_t:
        latents = latents[:, patch_t - latent_frames % patch_t :]
    with torch.no_grad():
        video = pipe.decode_latents(latents)  # (1, 3, F, H, W) in [-1, 1], model dtype
    if not torch.isfinite(video).all():
        bad = (~torch.isfinite(video)).flatten(3).any(-1)[0].any(0).nonzero().flatten().tolist()
        raise NonFiniteError(f"NaN/Inf in the decoded frames {bad} (VAE output before clamping)")
    frames = pipe.video_processor.postprocess_video(video=video, output_type="np")[0]  # (F, H, W, 3) [0, 1]
    frames = np.round(frames * 255).astype(np.uint8)
    decoded = _now(device)
    return JobFrames(frames=frames, denoise_s=denoised - start, decode_s=decoded - denoised)


def _now(device: torch.device) -> float:
    """Wall clock after the device has finished queued work (CUDA runs asynchronously)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()
