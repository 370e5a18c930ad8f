"""Run one generation job on a loaded pipeline and return checked uint8 frames.

The model-specific calls come from the pipeline's family (`sagevideo.pipelines.families`):
`denoise` (the pipeline call that returns latents) and `decode`. Around them, for every family:
latents are checked after every denoising step, so a failure names the step where it first
appeared; decoded frames are checked for NaN/Inf *before* post-processing clamps Inf away;
denoising and decoding are timed separately.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from sagevideo.jobs.specs import JobSpec
from sagevideo.pipelines.truncation import quiet_prompt_truncation


class NonFiniteError(RuntimeError):
    """NaN or Inf in latents or decoded frames."""


@dataclass
class JobFrames:
    """frames: (F, H, W, 3) uint8 RGB (None when the job was not decoded); timings in seconds.
    first_step_s: from the start of denoising (text encoding included) to the end of the first
    step: what compilation and warm-up cost a job, beside the steady steps (None: no step ran).
    first_step_at: the wall clock (`time.time()`) at the end of the first step, or None."""

    frames: np.ndarray | None
    denoise_s: float
    decode_s: float
    first_step_s: float | None = None
    first_step_at: float | None = None


def run_job(
    pipe,
    job: JobSpec,
    *,
    text_tokens: int,
    on_step: Callable[[int, int], None] | None = None,
    decode: bool = True,
    family: Any = None,
    image: Any = None,
) -> JobFrames:
    """Generate one video. `job` must have height/width/frames/steps resolved (ModelSource.resolve).

    on_step(step, steps) is called after each denoising step (1-based), once its latents are
    known to be finite; an exception it raises stops the job. decode=False stops after denoising
    (frames None): calibration, and the ranks of a sequence-parallel group other than 0.
    family: the pipeline's `ModelFamily` (default: found from the pipeline's class).
    image: the job's decoded input image ((H, W, 3) uint8, as `sagevideo.jobs.images.read_image`
    returns it; default: read from `job.image`, when the job has one), given to the family's
    `denoise` as `image=` after its `prepare_image`; jobs without an image pass no `image=`.

    The initial noise comes from a CPU generator seeded with job.seed, so a seed gives the same
    noise on every device (paired A/B runs rely on it).
    """
    if family is None:
        from sagevideo.pipelines.families import of_pipeline

        family = of_pipeline(pipe)
    device = pipe.transformer.device
    generator = torch.Generator("cpu").manual_seed(job.seed)
    first_step_end: list[float] = []

    def check_step(pipeline, step: int, timestep, tensors: dict) -> dict:
        if not torch.isfinite(tensors["latents"]).all():
            raise NonFiniteError(
                f"NaN/Inf in the latents after denoising step {step + 1}/{job.steps} "
                f"(timestep {int(timestep)})"
            )
        if not first_step_end:  # the finiteness check above waited for the device
            first_step_end.extend((time.perf_counter(), time.time()))
        if on_step is not None:
            on_step(step + 1, job.steps)
        return tensors

    extra: dict[str, Any] = {}
    if image is None and job.image is not None:
        from sagevideo.jobs.images import read_image

        image = read_image(job.image)
    if image is not None:
        extra["image"] = family.prepare_image(image, job)
    start = _now(device)
    with quiet_prompt_truncation():  # a cut prompt was said before the run, with its count; not its whole text here
        latents = family.denoise(pipe, job, generator=generator, text_tokens=text_tokens, callback=check_step,
                                 **extra)
    denoised = _now(device)
    first_step_s, first_step_at = (first_step_end[0] - start, first_step_end[1]) if first_step_end else (None, None)
    if not decode:
        return JobFrames(frames=None, denoise_s=denoised - start, decode_s=0.0, first_step_s=first_step_s,
                         first_step_at=first_step_at)
    with torch.no_grad():
        video = family.decode(pipe, job, latents)  # (1, 3, F, H, W) in [-1, 1], model dtype
    if not torch.isfinite(video).all():
        bad = (~torch.isfinite(video)).flatten(3).any(-1)[0].any(0).nonzero().flatten().tolist()
        raise NonFiniteError(f"NaN/Inf in the decoded frames {bad} (VAE output before clamping)")
    frames = family.postprocess(pipe, video)  # (F, H, W, 3) in [0, 1]
    frames = np.round(frames * 255).astype(np.uint8)
    decoded = _now(device)
    return JobFrames(frames=frames, denoise_s=denoised - start, decode_s=decoded - denoised,
                     first_step_s=first_step_s, first_step_at=first_step_at)


def _now(device: torch.device) -> float:
    """Wall clock after the device has finished queued work (CUDA runs asynchronously)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()
