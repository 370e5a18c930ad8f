"""`sagevideo.generate`: batch video generation into an output folder, resumable.

Two steps, so that every input problem is reported before a model is loaded:
- `plan_batch(...)` validates prompts, settings, model folder and output folder, resolves
  model defaults, the device and the attention backend, and gives each job a stable id and
  output name (raises `InputError`);
- `run_batch(plan)` loads the model once, installs sagevideo attention, runs the jobs that the
  manifest does not already show as done, writes each mp4 atomically and appends one manifest
  record per attempt. A failing job is recorded and the batch goes on.
`generate(...)` does both and returns the manifest records, one per job.
"""

from __future__ import annotations

import logging
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from sagevideo.jobs import (
    DEFAULT_PROMPTS,
    InputError,
    JobSpec,
    RunSettings,
    group_problems,
    job_id,
    output_stem,
    parse_jobs,
    read_prompts_file,
    validation_message,
)
from sagevideo.outputs.manifest import MANIFEST_NAME, Manifest, is_done, now_iso
from sagevideo.pipelines.loading import ModelSource, resolve_model

log = logging.getLogger("sagevideo")

PromptsOrJobs = str | Mapping[str, Any] | JobSpec | Iterable[str | Mapping[str, Any] | JobSpec] | None


class ModelLoadError(RuntimeError):
    """The model passed its checks but could not be loaded or prepared."""


@dataclass(frozen=True)
class PlannedJob:
    """A validated job with model defaults filled in, its id and its output file (relative)."""

    job: JobSpec
    job_id: str
    output: str
    label: str


@dataclass
class BatchPlan:
    """Everything `run_batch` needs; built by `plan_batch` without loading any model.

    backend: the `sageattn` backend the installed processors use, or None for attention="full".
    notes: facts the user should see before the run (e.g. why CPU runs the emulation).
    """

    out: Path
    settings: RunSettings
    source: ModelSource
    device: str
    dtype: str
    backend: str | None
    jobs: list[PlannedJob]
    notes: list[str] = field(default_factory=list)

    @property
    def manifest_path(self) -> Path:
        return self.out / MANIFEST_NAME


@dataclass
class BatchReport:
    """What a run did. records: one per planned job (the new record, or the done one it skipped)."""

    plan: BatchPlan
    records: list[dict[str, Any]]
    done: int = 0
    skipped: int = 0
    failed: int = 0
    attention: Counter = field(default_factory=Counter)  # backend label -> calls, e.g. "reference/fp16"
    fallbacks: Counter = field(default_factory=Counter)  # fallback reason -> calls

    @property
    def ok(self) -> bool:
        return self.failed == 0

    def summary_line(self) -> str:
        """One line, e.g. 'sagevideo: 2 done, 0 skipped, 0 failed → out (manifest.jsonl);
        attention: reference/fp16 x8'."""
        if self.plan.backend is None:
            attention = "full precision (nothing installed)"
        elif self.attention:
            attention = ", ".join(f"{label} x{n}" for label, n in self.attention.most_common())
        else:
            attention = f"{self.plan.backend}/{self.plan.settings.pv} (no new calls)"
        line = (
            f"sagevideo: {self.done} done, {self.skipped} skipped, {self.failed} failed → "
            f"{self.plan.out} ({MANIFEST_NAME}); attention: {attention}"
        )
        if self.fallbacks:
            reasons = "; ".join(f"{reason} (x{n})" for reason, n in self.fallbacks.most_common())
            line += f"; SDPA fallbacks: {reasons}"
        return line


def generate(
    prompts_or_jobs: PromptsOrJobs = None,
    *,
    out: str | Path,
    model: str = "tiny",
    progress: bool = True,
    **options: Any,
) -> list[dict[str, Any]]:
    """Generate one video per prompt/job into `out`; returns the manifest records, one per job.

    prompts_or_jobs: a prompt, a dict of `JobSpec` fields, a `JobSpec`, or a list of those;
    None (and no prompts_file) generates a built-in batch of two prompts.
    options: see `plan_batch` (seed, frames, height, width, steps, guidance, negative_prompt,
    attention, pv, backend, device, dtype, fps, prompts_file).
    Jobs that the manifest in `out` already records as done (with their file present) are skipped.
    Raises InputError before loading anything when an input is invalid.
    """
    plan = plan_batch(prompts_or_jobs, out=out, model=model, **options)
    for note in plan.notes:
        log.info(note)
    return run_batch(plan, progress=progress).records


def plan_batch(
    prompts_or_jobs: PromptsOrJobs = None,
    *,
    out: str | Path,
    model: str = "tiny",
    prompts_file: str | Path | None = None,
    seed: int = 0,
    frames: int | None = None,
    height: int | None = None,
    width: int | None = None,
    steps: int | None = None,
    guidance: float = 6.0,
    negative_prompt: str = "",
    attention: str = "sage",
    pv: str = "fp16",
    backend: str = "auto",
    device: str = "auto",
    dtype: str | None = None,
    fps: int = 8,
) -> BatchPlan:
    """Validate a batch and resolve everything about it without loading a model.

    frames/height/width/steps left as None take the model's defaults. Job fields given in a dict
    or JobSpec override the keyword defaults. Raises InputError naming each bad field and its fix.
    """
    try:
        settings = RunSettings(
            model=model, attention=attention, pv=pv, backend=backend, device=device, dtype=dtype, fps=fps
        )
    except ValidationError as err:
        raise InputError(validation_message(err, "settings")) from None
    labelled = _labelled_items(prompts_or_jobs, prompts_file)
    defaults = dict(
        seed=seed,
        frames=frames,
        height=height,
        width=width,
        steps=steps,
        guidance=guidance,
        negative_prompt=negative_prompt,
    )
    jobs = parse_jobs(labelled, defaults)
    source = resolve_model(settings.model)
    resolved = [(source.resolve(j), label) for j, (_, label) in zip(jobs, labelled, strict=True)]
    problems = [(label, problem) for j, label in resolved for problem in source.problems(j)]
    if problems:
        raise InputError(group_problems(problems))

    dev, dt = _resolve_device(settings)
    ran_backend, notes = _resolve_backend(settings, source, dev, dt)
    out_dir = _prepare_out_dir(out)  # last: the only check that writes (it may create the folder)
    id_settings = {
        "model": source.name,
        "model_fingerprint": source.fingerprint,
        "attention": settings.attention,
        "pv": settings.pv if ran_backend else None,
        "backend": ran_backend,
        "dtype": dt,
        "fps": settings.fps,
    }
    planned, seen, duplicates = [], set(), 0
    for j, label in resolved:
        jid = job_id(j, id_settings)
        if jid in seen:
            duplicates += 1
            continue
        seen.add(jid)
        planned.append(PlannedJob(job=j, job_id=jid, output=f"{output_stem(j, jid)}.mp4", label=label))
    if duplicates:
        notes.append(f"{duplicates} duplicate job(s) (same prompt and settings) will run once")
    return BatchPlan(
        out=out_dir,
        settings=settings,
        source=source,
        device=dev,
        dtype=dt,
        backend=ran_backend,
        jobs=planned,
        notes=notes,
    )


def run_batch(
    plan: BatchPlan, *, progress: bool = True, echo: Callable[[str], None] | None = None
) -> BatchReport:
    """Run the jobs of `plan` that are not done yet; see the module docstring."""
    from tqdm.auto import tqdm
    from tqdm.contrib.logging import logging_redirect_tqdm

    echo = echo or log.warning
    manifest = Manifest(plan.manifest_path)
    latest = manifest.latest()
    report = BatchReport(plan=plan, records=[])
    todo: list[tuple[int, PlannedJob]] = []
    for index, pj in enumerate(plan.jobs):
        previous = latest.get(pj.job_id)
        if is_done(previous, plan.out):
            report.skipped += 1
            report.records.append(previous)
        else:
            todo.append((index, pj))
            report.records.append({})  # filled in below, keeping plan order
    if not todo:
        return report

    bar = tqdm(
        total=len(plan.jobs),
        initial=report.skipped,
        disable=not progress,
        unit="video",
        desc="sagevideo",
        dynamic_ncols=True,
    )
    # Library warnings (e.g. diffusers' prompt truncation) print above the bar, not through it.
    libraries = [logging.getLogger(name) for name in ("diffusers", "transformers")]
    handle = None
    try:
        with logging_redirect_tqdm(loggers=libraries, tqdm_class=tqdm):
            bar.set_postfix_str(f"loading {Path(plan.source.name).name}", refresh=True)
            pipe, handle, load_s = _load(plan)
            for index, pj in todo:
                bar.set_postfix_str(pj.output[:32], refresh=True)
                record = _run_one(plan, pj, pipe, load_s, echo, report)
                load_s = 0.0  # charged to the first job attempted
                manifest.append(record)
                report.records[index] = record
                bar.update(1)
    finally:
        bar.close()
        if handle is not None:
            handle.remove()
    return report


def _run_one(
    plan: BatchPlan,
    pj: PlannedJob,
    pipe: Any,
    load_s: float,
    echo: Callable[[str], None],
    report: BatchReport,
) -> dict[str, Any]:
    from sagevideo.api.backends import record_backends
    from sagevideo.outputs.video import write_mp4
    from sagevideo.pipelines.runner import run_job

    record = _base_record(plan, pj)
    timings = {"load_s": round(load_s, 4), "denoise_s": None, "decode_s": None, "write_s": None}
    with record_backends() as calls:
        try:
            result = run_job(pipe, pj.job, text_tokens=plan.source.text_tokens)
            timings["denoise_s"], timings["decode_s"] = round(result.denoise_s, 4), round(result.decode_s, 4)
            start = time.perf_counter()
            write_mp4(result.frames, plan.out / pj.output, fps=plan.settings.fps)
            timings["write_s"] = round(time.perf_counter() - start, 4)
            record.update(status="done", outputs=[pj.output])
            report.done += 1
        except Exception as err:  # one failed job must not stop the batch; KeyboardInterrupt does
            message = f"{type(err).__name__}: {err}"
            record.update(status="failed", error=message)
            report.failed += 1
            log.debug("job %s failed", pj.job_id, exc_info=True)
            echo(f"sagevideo: job {pj.job_id} ({pj.label}) failed: {message}")
    summary = calls.summary()
    report.attention.update(summary["counts"])
    report.fallbacks.update(summary["fallbacks"])
    record.update(backends=summary, timings=timings, created=now_iso())
    return record


def _base_record(plan: BatchPlan, pj: PlannedJob) -> dict[str, Any]:
    import sagevideo

    j = pj.job
    return {
        "job_id": pj.job_id,
        "status": None,
        "error": None,
        "prompt": j.prompt,
        "negative_prompt": j.negative_prompt,
        "seed": j.seed,
        "frames": j.frames,
        "height": j.height,
        "width": j.width,
        "steps": j.steps,
        "guidance": j.guidance,
        "name": j.name,
        "model": plan.source.name,
        "model_fingerprint": plan.source.fingerprint,
        "attention": plan.settings.attention,
        "pv": plan.settings.pv if plan.backend else None,
        "backend": plan.backend,
        "device": plan.device,
        "dtype": plan.dtype,
        "fps": plan.settings.fps,
        "backends": None,
        "timings": None,
        "outputs": [],
        "created": None,
        "sagevideo_version": sagevideo.__version__,
    }


def _load(plan: BatchPlan) -> tuple[Any, Any, float]:
    """(pipeline, install handle or None, load seconds)."""
    import torch

    from sagevideo.pipelines.install import install
    from sagevideo.pipelines.loading import load_pipeline

    start = time.perf_counter()
    try:
        pipe = load_pipeline(plan.source, plan.device, getattr(torch, plan.dtype))
        handle = install(pipe, pv=plan.settings.pv, backend=plan.backend) if plan.backend else None
    except Exception as err:
        raise ModelLoadError(f"could not load model {plan.source.name}: {type(err).__name__}: {err}") from err
    return pipe, handle, time.perf_counter() - start


def _labelled_items(prompts_or_jobs: PromptsOrJobs, prompts_file: str | Path | None) -> list[tuple[Any, str]]:
    items: list[tuple[Any, str]] = list(read_prompts_file(prompts_file)) if prompts_file is not None else []
    if isinstance(prompts_or_jobs, (str, Mapping, JobSpec)):
        prompts_or_jobs = [prompts_or_jobs]
    if prompts_or_jobs is not None:
        items += [(item, f"job {i}") for i, item in enumerate(prompts_or_jobs, start=1)]
    if not items and prompts_file is None and prompts_or_jobs is None:
        items = [(p, f"default prompt {i}") for i, p in enumerate(DEFAULT_PROMPTS, start=1)]
    if not items:
        raise InputError("no prompts to generate; give at least one")
    return items


def _prepare_out_dir(out: str | Path) -> Path:
    """Create the output folder if needed and prove it is writable (a probe file)."""
    path = Path(out).expanduser()
    if path.exists() and not path.is_dir():
        raise InputError(f"--out {out}: is a file, not a folder; give a folder for the videos and manifest")
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path, prefix=".sagevideo-probe-"):
            pass
    except OSError as err:
        raise InputError(
            f"--out {out}: cannot write there ({err.strerror or err}); give a writable folder"
        ) from None
    manifest = path / MANIFEST_NAME
    if manifest.exists() and (not manifest.is_file()):
        raise InputError(f"--out {out}: {MANIFEST_NAME} there is not a file; remove it or use another folder")
    return path


def _resolve_device(settings: RunSettings) -> tuple[str, str]:
    """(device, dtype name): auto -> CUDA when torch sees a GPU; dtype bf16 on CUDA, fp32 on CPU."""
    import torch

    device = settings.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    elif device == "cuda" and not torch.cuda.is_available():
        raise InputError(
            f"--device cuda: torch {torch.__version__} sees no CUDA GPU; use --device cpu or auto"
        )
    dtype = settings.dtype or ("bfloat16" if device == "cuda" else "float32")
    return device, dtype


def _resolve_backend(
    settings: RunSettings, source: ModelSource, device: str, dtype: str
) -> tuple[str | None, list[str]]:
    """(sageattn backend for the processors or None, notes). Explicit choices that cannot run raise."""
    import torch

    from sagevideo.kernels import plans

    if settings.attention == "full":
        return None, ["attention: full precision (the stock CogVideoX processor; nothing installed)"]
    backend = settings.backend
    if backend == "auto" and device == "cpu":
        # On CPU, sageattn's auto would fall back to full-precision SDPA and the run would not
        # exercise quantized numerics at all; the reference emulates them exactly.
        return "reference", [
            f"attention: --backend auto on CPU runs the quantization emulation (reference/{settings.pv}); "
            "the Triton kernels need a CUDA GPU"
        ]
    if backend in ("auto", "triton"):
        choice = plans.select_plan(torch.device(device), source.head_dim, settings.pv)
        problem = choice.reason
        if not problem and dtype not in ("float16", "bfloat16"):
            problem = f"dtype {dtype}: the Triton kernels take float16 or bfloat16"
        if problem and backend == "triton":
            raise InputError(f"--backend triton cannot run: {problem}; use --backend auto or reference")
        if problem:
            return "auto", [f"attention: the Triton kernels cannot run ({problem}); auto falls back to SDPA"]
        return backend, [f"attention: Triton kernels ({choice.plan.describe()})"]
    return backend, [f"attention: sageattn backend {backend}/{settings.pv}"]
