"""`sagevideo.calibrate(...)`: load a model, run prompts with probing attention, write a plan.

The model and its job constraints come from its family (`sagevideo.pipelines.families`, through
`resolve_model`); the prompts run through the one generation path (`PipelineHost.generate`,
denoising only) with the probing router as the host's attention hook."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sagevideo.jobs.specs import (
    DEFAULT_PROMPTS,
    InputError,
    collect_jobs,
    group_problems,
    option_place,
    option_problems,
)


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
    progress: bool = True,
) -> Any:
    """Calibrate attention per layer on `prompts` and save the chosen plan to `out` (JSON).

    capture_steps: denoising step indices to measure (negative counts from the end; None: all).
    threshold: worst cosine (vs fp32 attention) a quantized mode must reach in a layer.
    save_qkv: also save the captured Q/K/V (first call per layer and step) for `sagevideo simulate --qkv`.
    progress: a progress bar on stderr (denoising steps of every prompt, and the layer measured).
    Returns a `CalibrationResult` (errors per layer and mode, the plan, the choices).
    Raises InputError before loading anything when an input is invalid.
    """
    from sagevideo.outputs.files import writable_file
    from sagevideo.pipelines.loading import resolve_model

    if not 0 < threshold <= 1:
        raise InputError(f"--threshold {threshold}: not a cosine in (0, 1]; the default is 0.999")
    options = dict(seed=seed, frames=frames, height=height, width=width, steps=steps, guidance=guidance)
    _, problems = option_problems(options)
    if problems:
        raise InputError(group_problems(problems))
    # Both files are written after the whole calibration: a path that cannot take them fails now.
    out = writable_file(out, "--out", InputError)
    if save_qkv is not None:
        save_qkv = writable_file(save_qkv, "--save-qkv", InputError, "qkv.safetensors")
        if save_qkv.resolve() == out.resolve():
            raise InputError(f"--save-qkv {save_qkv}: is the --out file; give the Q/K/V their own file")
    if prompts is not None and not prompts:
        raise InputError("no prompts to calibrate on; give --prompt or a prompts file with one prompt per line")
    source = resolve_model(model)
    given = {k: v for k, v in options.items() if v is not None}
    parsed, problems = collect_jobs([(p, f"--prompt {p!r}") for p in (prompts or DEFAULT_PROMPTS)], given)
    if problems:
        raise InputError(group_problems(problems))
    jobs = [source.resolve(job) for job, _, _ in parsed]
    for problem in source.problems(jobs[0]):  # sizes and frames come from the options (or the model)
        field, text = problem.split(": ", 1)
        problems.append((option_place(field, options[field]) if options.get(field) else f"--model {model}", text))
    if problems:
        raise InputError(group_problems(problems))
    _check_memory(source, jobs, device)
    n_steps = jobs[0].steps
    captured = None
    if capture_steps is not None:
        bad = [s for s in capture_steps if not -n_steps <= s < n_steps]
        if bad:
            raise InputError(
                f"--capture-steps {bad} are outside the run's {n_steps} steps (0..{n_steps - 1}, or -1 for the last)"
            )
        captured = {s % n_steps for s in capture_steps}
    return _run(source, jobs, out, captured, threshold, device, n_steps, save_qkv, progress)


def _check_memory(source, jobs, device: str) -> None:
    """Refuse, with the estimate, a calibration whose denoising cannot fit in the device's free memory
    (it decodes nothing: the video stays latent)."""
    import torch

    from sagevideo.generation.budget import available_bytes, format_bytes
    from sagevideo.generation.estimate import OVERHEAD_BYTES, estimate_job

    dev = ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device
    dtype = "bfloat16" if dev.startswith("cuda") else "float32"
    estimate = estimate_job(source, jobs[0], "reference" if dev == "cpu" else "triton", dtype)
    need, free = estimate.weights + estimate.denoise + OVERHEAD_BYTES, available_bytes(dev)
    if free is not None and need > free:
        raise InputError(
            f"calibrating at {jobs[0].width}x{jobs[0].height}, {jobs[0].frames} frames needs about "
            f"{format_bytes(need)} ({estimate.tokens:,} tokens per attention call), but the {dev} has "
            f"{format_bytes(free)} free; use a smaller --width/--height or fewer --frames"
        )


def _run(source, jobs, out, captured, threshold, device, n_steps, save_qkv, progress):
    """Generate every prompt's latents through the one generation path (a `PipelineHost` whose
    attention hook installs the probing router), then choose and save the plan."""
    import sys

    import torch
    from tqdm.auto import tqdm

    from sagevideo.host.pipeline_host import PipelineHost, PlannedJob, RouterAttention, RunContext
    from sagevideo.pipelines.calibrate import calibration_result, probing_router

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = "bfloat16" if device.startswith("cuda") else "float32"
    bar = tqdm(total=len(jobs) * n_steps, unit="step", desc="calibrate", disable=not progress, file=sys.stderr,
               dynamic_ncols=True)
    bar.set_postfix_str(f"loading {source.name if source.is_tiny else source.path.name}", refresh=True)

    def measured(layer: str, step: int | None) -> None:
        bar.set_postfix_str(f"measuring {layer} (step {step})", refresh=True)

    tensors: dict | None = {} if save_qkv is not None else None
    try:
        # Nothing is written: the video stays latent (out only names where the host would stage files).
        host = PipelineHost(RunContext(out=out.parent, source=source, device=device, dtype=dtype, fps=8))
        probe = probing_router(host.pipe, capture_steps=captured, save_qkv=tensors,
                               on_measure=measured if progress else None)
        host.attention = RouterAttention(probe)
        try:
            for number, job in enumerate(jobs, start=1):
                bar.set_postfix_str(f"prompt {number}/{len(jobs)}", refresh=True)
                pj = PlannedJob(job=job, job_id=f"calibrate-{number}", output=f"calibrate-{number}.mp4",
                                label=f"prompt {number}", backend=probe.backend)
                host.generate(pj, on_step=lambda step, steps: bar.update(1), decode=False)
        finally:
            host.close()
        result = calibration_result(probe, host.pipe, threshold=threshold, num_steps=n_steps)
    finally:
        bar.close()
    result.plan.save(out)
    if save_qkv is not None:
        from safetensors.torch import save_file

        save_file(tensors, str(save_qkv))
    return result
