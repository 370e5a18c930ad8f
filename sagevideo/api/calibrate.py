"""`sagevideo.calibrate(...)`: load a model, run prompts with probing attention, write a plan."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sagevideo.jobs import DEFAULT_PROMPTS, InputError, JobSpec


def calibrate(
    prompts: list[str] | None = None,
    *,
    out: str | Path,
    model: str = "tiny",
    steps: int | None = None,
    frames: int | None = None,
    height: int | None = None,
    width: int | None = None,
    guidance: float = 6.0,
    seed: int = 0,
    capture_steps: list[int] | None = None,
    threshold: float = 0.999,
    device: str = "auto",
    save_qkv: str | Path | None = None,
) -> Any:
    """Calibrate attention per layer on `prompts` and save the chosen plan to `out` (JSON).

    capture_steps: denoising step indices to measure (negative counts from the end; None: all).
    threshold: worst cosine (vs fp32 attention) a quantized mode must reach in a layer.
    save_qkv: also save the captured Q/K/V (first call per layer and step) for `sagevideo simulate --qkv`.
    Returns a `CalibrationResult` (errors per layer and mode, the plan, the choices).
    Raises InputError before loading anything when an input is invalid.
    """
    from sagevideo.pipelines.loading import resolve_model

    out = Path(out)
    if not 0 < threshold <= 1:
        raise InputError(f"threshold: {threshold} is not a cosine in (0, 1]; the default is 0.999")
    if not out.parent.is_dir():
        raise InputError(f"--out {out}: folder {out.parent} does not exist; create it first")
    source = resolve_model(model)
    try:
        jobs = [
            source.resolve(JobSpec(prompt=p, seed=seed, frames=frames, height=height, width=width, steps=steps,
                                   guidance=guidance))
            for p in (prompts or DEFAULT_PROMPTS)
        ]
    except ValueError as err:
        raise InputError(str(err)) from None
    problems = source.problems(jobs[0])
    if problems:
        raise InputError("; ".join(problems))
    n_steps = jobs[0].steps
    captured = None
    if capture_steps is not None:
        bad = [s for s in capture_steps if not -n_steps <= s < n_steps]
        if bad:
            raise InputError(
                f"capture steps {bad} are outside the run's {n_steps} steps (0..{n_steps - 1}, or -1 for the last)"
            )
        captured = {s % n_steps for s in capture_steps}
    return _run(source, jobs, out, captured, threshold, device, n_steps, save_qkv)


def _run(source, jobs, out, captured, threshold, device, n_steps, save_qkv):
    import torch

    from sagevideo.pipelines.calibrate import calibrate_pipeline
    from sagevideo.pipelines.loading import load_pipeline

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    pipe = load_pipeline(source, device, dtype)

    def run(pipe):
        for job in jobs:
            pipe(
                prompt=job.prompt, negative_prompt=job.negative_prompt or None, height=job.height, width=job.width,
                num_frames=job.frames, num_inference_steps=job.steps, guidance_scale=job.guidance,
                generator=torch.Generator("cpu").manual_seed(job.seed), output_type="latent",
                max_sequence_length=source.text_tokens,
            )

    tensors: dict | None = {} if save_qkv is not None else None
    result = calibrate_pipeline(pipe, run, threshold=threshold, capture_steps=captured, num_steps=n_steps,
                                save_qkv=tensors)
    result.plan.save(out)
    if save_qkv is not None:
        from safetensors.torch import save_file

        save_file(tensors, str(save_qkv))
    return result
