"""Run planned jobs on a loaded pipeline: the part the in-process path and Ray workers share.

`PipelineHost(context)` loads the model once. `host.run(planned_job)` sets the attention the job
asks for (installing or removing sagevideo's processors only when it changes between jobs),
generates, writes the mp4 under a *staged* name (`sagevideo.outputs.staging`) and returns the
job's `ManifestRecord`, its `handoff` naming the staged files. Nothing here appends to the manifest or
gives a file its final name: the driver does both (`sagevideo.generation.run.run_batch`), so there
is exactly one writer of the manifest and of final names, however many workers run.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sagevideo.errors import ModelLoadError
from sagevideo.host.deadline import deadline
from sagevideo.jobs.specs import JobSpec
from sagevideo.outputs.manifest import Handoff, ManifestRecord, now_iso
from sagevideo.pipelines.loading import ModelSource

# Test hook (read by the driver, handed to workers): "PROMPT_SUBSTRING[:TIMES][@RANK][,...]" makes
# the process running a matching job exit abruptly (os._exit) right after its video is staged, on
# its first TIMES attempts (default 1): a worker (or, without Ray, the driver) killed mid-batch.
# @RANK targets one rank of a sequence-parallel group (`sagevideo.host.sharded`), which exits in the
# middle of denoising instead, while its peers wait for it in a collective; a rule without @RANK
# fires on every rank. A plain worker is rank 0.
KILL_HOOK_ENV = "SAGEVIDEO_TEST_KILL_WORKER"
KILL_EXIT_CODE = 87


@dataclass(frozen=True)
class PlannedJob:
    """A validated job with model defaults, attention and pv filled in, its id and output (relative).

    backend: the `sageattn` backend its processors use, or None for attention="full".
    plan_sha256: first 16 hex digits of the attention-plan file's SHA-256 (None without a plan).
    """

    job: JobSpec
    job_id: str
    output: str
    label: str
    backend: str | None = None
    plan_sha256: str | None = None

    @property
    def frames_dir(self) -> str | None:
        """The PNG frames folder's name (relative), or None when the job asks for no PNGs."""
        return f"{Path(self.output).stem}_frames" if self.job.frames_png else None

    @property
    def outputs(self) -> list[str]:
        """Every final name the job writes (relative to the output folder): mp4 first."""
        return [self.output] + ([self.frames_dir] if self.frames_dir else [])

    def remove_leftovers(self, out: Path) -> None:
        """Delete the staged and partial files of every output of this job in `out` (not the finals)."""
        from sagevideo.outputs.staging import remove_leftovers

        for name in self.outputs:
            remove_leftovers(out / name)

    def step_text(self, step: int, steps: int, width: int = 24) -> str:
        """Progress-bar text for a denoising step of this job: its output's stem, shortened, and step/steps."""
        return f"{self.output.removesuffix('.mp4')[:width]} {step}/{steps}"


@dataclass(frozen=True)
class RunContext:
    """What a worker needs to run a batch's jobs (small and picklable: no jobs, no model).

    cpu_threads: torch intra-op threads for a CPU worker that shares its machine with other
    workers (None: torch's default, right for a process that has the machine to itself)."""

    out: Path
    source: ModelSource
    device: str
    dtype: str
    fps: int
    cpu_threads: int | None = None


@dataclass(frozen=True)
class KillHook:
    """The parsed `SAGEVIDEO_TEST_KILL_WORKER` hook: (prompt substring, attempts to kill, rank or
    None for every rank) rules."""

    rules: tuple[tuple[str, int, int | None], ...]

    @classmethod
    def parse(cls, spec: str | None) -> KillHook | None:
        if not spec:
            return None
        rules = []
        for part in spec.split(","):
            text, at, rank = part.rpartition("@")
            if not (at and text and rank.isdigit()):
                text, rank = part, None
            head, _, tail = text.rpartition(":")
            text, times = (head, int(tail)) if head and tail.isdigit() else (text, 1)
            rules.append((text, times, None if rank is None else int(rank)))
        return cls(tuple(rules))

    def fires(self, pj: PlannedJob, attempt: int, rank: int = 0) -> bool:
        """Whether a rule matches this job, attempt and rank."""
        return any(
            text in pj.job.prompt and attempt <= times and at in (None, rank) for text, times, at in self.rules
        )

    def maybe_exit(self, pj: PlannedJob, attempt: int, rank: int = 0) -> None:
        if self.fires(pj, attempt, rank):
            exit_now()


def exit_now() -> None:
    """Leave the process at once: no cleanup, no exception, like a kill -9 or a segfault."""
    os._exit(KILL_EXIT_CODE)


def worker_info(node: str | None = None) -> dict[str, Any]:
    """Who ran a job: host name, process id, Ray node id (None without Ray)."""
    return {"host": socket.gethostname(), "pid": os.getpid(), "node": node}


def base_record(ctx: RunContext, pj: PlannedJob) -> ManifestRecord:
    """A job's manifest record before it runs (fields: see `sagevideo.outputs.manifest`)."""
    import sagevideo

    j = pj.job
    return ManifestRecord(
        job_id=pj.job_id,
        prompt=j.prompt,
        negative_prompt=j.negative_prompt,
        seed=j.seed,
        frames=j.frames,
        height=j.height,
        width=j.width,
        steps=j.steps,
        guidance=j.guidance,
        name=j.name,
        model=ctx.source.name,
        model_fingerprint=ctx.source.fingerprint,
        attention=j.attention,
        pv=j.pv if pj.backend else None,
        backend=pj.backend,
        plan=j.plan,
        plan_sha256=pj.plan_sha256,
        device=ctx.device,
        dtype=ctx.dtype,
        fps=ctx.fps,
        sagevideo_version=sagevideo.__version__,
    )


def is_device_error(err: BaseException) -> bool:
    """CUDA errors and out-of-memory: the process's GPU state is suspect, so the job deserves a
    fresh worker rather than a 'failed' verdict (a NaN or a bad input is not retried)."""
    import torch

    if isinstance(err, (torch.cuda.OutOfMemoryError, MemoryError)):
        return True
    accelerator_error = getattr(torch, "AcceleratorError", None)  # torch >= 2.8
    if accelerator_error is not None and isinstance(err, accelerator_error):
        return True
    return isinstance(err, RuntimeError) and any(s in str(err) for s in ("CUDA error", "CUDA out of memory"))


class PipelineHost:
    """One loaded pipeline and the attention currently installed on it.

    load_s: seconds the load took; charged to the first job this host runs (as in a manifest
    record's timings.load_s). worker: `worker_info()` written into every record.
    """

    def __init__(self, ctx: RunContext, *, worker: dict[str, Any] | None = None, kill_hook: KillHook | None = None):
        self.ctx = ctx
        self.worker = worker or worker_info()
        self.kill_hook = kill_hook
        if ctx.cpu_threads and ctx.device == "cpu":
            import torch

            torch.set_num_threads(ctx.cpu_threads)
        self.pipe, self.load_s = _load(ctx)
        self._handle = None
        self._attention: tuple[str | None, str | None] | None = None  # (backend, pv) installed now

    def run(
        self,
        pj: PlannedJob,
        *,
        attempt: int = 1,
        on_step: Callable[[int, int], None] | None = None,
        time_limit: float | None = None,
    ) -> ManifestRecord:
        """Generate one job; returns its record (status "done" with `handoff.staged` and, for
        frames_png, `handoff.staged_frames`; or "failed" with the error; `handoff.device_error` marks
        errors a fresh worker may not have, `handoff.storage_full` a disk or quota too full to write
        the video). on_step(step,
        steps) after each denoising step (it may raise to stop the job). time_limit: seconds the
        generation may take, enforced mid-step where it can be (see `sagevideo.host.deadline`). Never
        raises for a job's own failure; KeyboardInterrupt and SystemExit go through."""
        from sagevideo.attention.records import record_backends
        from sagevideo.outputs.staging import staged_path
        from sagevideo.outputs.video import VideoWriteError, write_frames_png, write_mp4
        from sagevideo.pipelines import runner  # looked up per call: tests patch runner.run_job

        record = base_record(self.ctx, pj)
        record.attempts, record.worker, record.started = attempt, self.worker, now_iso()
        handoff: dict[str, Any] = {}
        timings = {"load_s": round(self.load_s, 4), "denoise_s": None, "decode_s": None, "write_s": None}
        self.load_s = 0.0
        with record_backends() as calls:
            try:
                self._set_attention(pj.backend, pj.job.pv, pj.job.plan)
                with deadline(time_limit):
                    result = runner.run_job(
                        self.pipe, pj.job, text_tokens=self.ctx.source.text_tokens, on_step=on_step
                    )
                timings["denoise_s"], timings["decode_s"] = round(result.denoise_s, 4), round(result.decode_s, 4)
                start = time.perf_counter()
                staged = write_mp4(
                    result.frames, staged_path(self.ctx.out / pj.output), fps=self.ctx.fps, name=pj.output
                )
                handoff["staged"] = staged.name
                if pj.frames_dir:
                    pngs = write_frames_png(
                        result.frames, staged_path(self.ctx.out / pj.frames_dir), name=pj.frames_dir
                    )
                    handoff["staged_frames"] = pngs.name
                timings["write_s"] = round(time.perf_counter() - start, 4)
                record.status = "done"
            except Exception as err:  # one failed job must not stop the batch; KeyboardInterrupt does
                record.status, record.error = "failed", f"{type(err).__name__}: {err}"
                handoff["device_error"] = is_device_error(err)
                # The driver stops the batch on a full disk: every later write would fail.
                handoff["storage_full"] = isinstance(err, VideoWriteError) and err.storage_full
        record.backends, record.timings, record.created = calls.summary(), timings, now_iso()
        record.handoff = Handoff(**handoff)
        if self.kill_hook is not None:
            self.kill_hook.maybe_exit(pj, attempt)
        return record

    def close(self) -> None:
        """Remove installed attention (the pipeline object may outlive this host)."""
        if self._handle is not None:
            self._handle.remove()
            self._handle = None

    def _set_attention(self, backend: str | None, pv: str | None, plan: str | None = None) -> None:
        """Install sagevideo attention for (backend, pv, plan), or none for backend None; only on change.
        With a plan, the plan says which attention each layer and step runs; without, `pv` everywhere."""
        from sagevideo.pipelines.install import install

        if self._attention == (backend, pv, plan):
            return
        if self._handle is not None:
            self._handle.remove()
            self._handle = None
        self._attention = None  # stays None if install raises: the next job tries again
        if backend is not None:
            self._handle = install(self.pipe, plan, pv=pv, backend=backend)
        self._attention = (backend, pv, plan)


def _load(ctx: RunContext) -> tuple[Any, float]:
    """(pipeline, load seconds); any failure becomes ModelLoadError with the cause."""
    import torch

    from sagevideo.pipelines import loading  # looked up per call: tests patch loading.load_pipeline

    start = time.perf_counter()
    try:
        pipe = loading.load_pipeline(ctx.source, ctx.device, getattr(torch, ctx.dtype))
    except Exception as err:
        raise ModelLoadError(f"could not load model {ctx.source.name}: {type(err).__name__}: {err}") from err
    return pipe, time.perf_counter() - start
