"""The one generation path: a loaded pipeline that runs planned jobs, whoever asks.

`PipelineHost(context)` loads the model once (through its family). `host.generate(planned_job)`
is the generation loop every runner uses: it sets the attention the job asks for (through the
host's attention hook, only when it changes between jobs), then denoises (and decodes) with the
family's calls (`sagevideo.pipelines.runner.run_job`) under the job's time limit. A job's input
image is read here, where the job runs, from its path (shared storage, as attention plans are),
and refused when its content is not the planned one (`sagevideo.jobs.images.read_image`).
`host.run(job)` adds what a batch needs: the mp4 (and PNG frames) written under *staged* names
(`sagevideo.outputs.staging`) and the job's `ManifestRecord`, its `handoff` naming the staged files;
`host.run_rank(job)` gives it as this process's `RankResult` (`sagevideo.host.result`), what every
worker hands back.
Nothing here appends to the manifest or gives a file its final name: the driver does both
(`sagevideo.generation.run.run_batch`), so there is exactly one writer of the manifest and of
final names, however many workers run.

Who composes it: the in-process batch and Ray workers use it as it is; a sequence-parallel rank
(`sagevideo.host.sharded.ShardedHost`, under Ray or `python -m sagevideo.generation.torchrun`)
gives it the family's Ulysses hooks as its attention hook; calibration and the attention probe
(`sagevideo.experiments`) give it their measuring router (`RouterAttention`).
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sagevideo.errors import ModelLoadError
from sagevideo.host import failpoints
from sagevideo.host.deadline import deadline
from sagevideo.host.result import RankResult
from sagevideo.jobs.identity import JobIdentity
from sagevideo.jobs.recipe import Recipe
from sagevideo.jobs.sparse import is_sparse
from sagevideo.jobs.specs import JobSpec
from sagevideo.outputs.manifest import Handoff, ManifestRecord, now_iso
from sagevideo.pipelines.loading import ModelSource

RETRACE_ON_SWITCH = (
    "sagevideo: jobs of this batch switch attention (e.g. 'full' and 'sage', or another pv, plan or sparse "
    "setting) under a compile recipe: at each switch torch.compile traces the blocks again; put jobs of one "
    "attention setting together, or run them as separate batches, to compile once"
)


@dataclass(frozen=True)
class PlannedJob:
    """A validated job with model defaults, attention and pv filled in, its id and output (relative).

    backend: the `sageattn` backend its processors use, or None for attention="full".
    plan_sha256: first 16 hex digits of the attention-plan file's SHA-256 (None without a plan).
    image_sha256: SHA-256 (64 hex digits) of the input image `job.image` as planned (None without
    one); the host reads the file at that path and refuses other content.
    identity: what `job_id` was made from (`sagevideo.jobs.identity`), None for jobs outside a
    batch (calibration, the probe): it gives the render key and the ids under other models.
    """

    job: JobSpec
    job_id: str
    output: str
    label: str
    backend: str | None = None
    plan_sha256: str | None = None
    image_sha256: str | None = None
    identity: JobIdentity | None = None

    @property
    def render_key(self) -> str | None:
        """What decides the job's pixels (jobs that share it make the same video), or None."""
        return self.identity.render_key if self.identity is not None else None

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
    recipe: Recipe | None = None
    attention_guard: str = "warn"


def worker_info(node: str | None = None) -> dict[str, Any]:
    """Who ran a job: host name, process id, Ray node id (None without Ray)."""
    return {"host": socket.gethostname(), "pid": os.getpid(), "node": node}


def base_record(ctx: RunContext, pj: PlannedJob) -> ManifestRecord:
    """A job's manifest record before it runs (fields: see `sagevideo.outputs.manifest`)."""
    from sagevideo.version import __version__

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
        family=ctx.source.family,
        attention=j.attention,
        pv=j.pv if pj.backend else None,
        backend=pj.backend,
        plan=j.plan,
        plan_sha256=pj.plan_sha256,
        sparse=j.sparse if is_sparse(j.sparse) and pj.backend else None,
        image=j.image,
        image_sha256=pj.image_sha256,
        device=ctx.device,
        dtype=ctx.dtype,
        fps=ctx.fps,
        sagevideo_version=__version__,
        render_key=pj.render_key,
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


class PlanAttention:
    """The default attention hook: `install(pipe, plan, pv=, backend=, guard=)` for sagevideo attention,
    nothing for attention "full" (backend None: the stock processors run)."""

    def __init__(self, guard: str = "warn"):
        self.guard = guard

    def __call__(self, pipe: Any, backend: str | None, pv: str | None, plan: str | None) -> Any:
        if backend is None:
            return None
        from sagevideo.pipelines.install import install

        return install(pipe, plan, pv=pv, backend=backend, guard=self.guard)


class RouterAttention:
    """An attention hook that installs one ready router for every job, whatever the job asks
    (calibration's probing router, the attention probe's router)."""

    def __init__(self, router: Any, *, pv: str = "fp16", backend: str = "auto"):
        self.router, self.pv, self.backend = router, pv, backend

    def __call__(self, pipe: Any, backend: str | None, pv: str | None, plan: str | None) -> Any:
        from sagevideo.pipelines.install import install_router

        return install_router(pipe, self.router, pv=self.pv, backend=self.backend)


class PipelineHost:
    """One loaded pipeline and the attention currently installed on it.

    attention: the hook that installs attention for a job, called as hook(pipe, backend, pv, plan)
    -> a handle with `remove()` or None (default `PlanAttention()`). rank: this process's rank in
    a sequence-parallel group (0 otherwise; failpoints can target a rank).
    load_s: seconds the load took; charged to the first job this host runs (as in a manifest
    record's timings.load_s). worker: `worker_info()` written into every record.
    Raises ModelLoadError when the model cannot be loaded.
    """

    def __init__(
        self,
        ctx: RunContext,
        *,
        worker: dict[str, Any] | None = None,
        attention: Callable[[Any, str | None, str | None, str | None], Any] | None = None,
        rank: int = 0,
    ):
        self.ctx = ctx
        self.worker = worker or worker_info()
        self.attention = attention or PlanAttention(ctx.attention_guard)
        self.rank = rank
        if ctx.cpu_threads and ctx.device == "cpu":
            import torch

            torch.set_num_threads(ctx.cpu_threads)
        self._load_started_at = time.time()  # a worker's start-up before its load: process_to_load_s
        self.pipe, self.load_s = _load(ctx)
        self.recipe: Any = None  # the AppliedRecipe, once applied (after the first attention install)
        self.recipe_s = 0.0  # seconds applying it took, charged to the job it was applied for
        self._handle = None
        self._started_timed = False  # process_to_first_step_s recorded (on the host's first job)
        self._attention: tuple[str | None, str | None, str | None] | None = None  # (backend, pv, plan) now
        self._told_retrace = False  # a switch of attention under this host's own compile was said

    @property
    def family(self) -> Any:
        """The loaded model's `ModelFamily`."""
        return self.ctx.source.model_family

    def generate(
        self,
        pj: PlannedJob,
        *,
        attempt: int = 1,
        on_step: Callable[[int, int], None] | None = None,
        time_limit: float | None = None,
        decode: bool = True,
    ) -> Any:
        """The generation loop: the job's attention set, then its denoising (and, with decode, its
        VAE decode) -> `runner.JobFrames`. on_step(step, steps) after each denoising step (it may
        raise to stop the job); time_limit: seconds it may take, enforced mid-step where it can be
        (see `sagevideo.host.deadline`). Raises what the job raises."""
        from sagevideo.pipelines import runner  # looked up per call: tests patch runner.run_job

        image = None
        if pj.job.image is not None:  # read here, where the job runs; content checked against the plan's
            from sagevideo.jobs.images import read_image

            image = read_image(pj.job.image, pj.image_sha256)
        self._set_attention(pj.backend, pj.job.pv, self._plan_of(pj))
        self._apply_recipe(pj.job.steps)
        with self._mid_denoise_failpoint(pj, attempt), deadline(time_limit):
            return runner.run_job(
                self.pipe, pj.job, text_tokens=self.ctx.source.text_tokens, on_step=self._recipe_steps(on_step),
                decode=decode, family=self.family, image=image,
            )

    def _recipe_steps(self, on_step: Callable[[int, int], None] | None) -> Callable[[int, int], None] | None:
        """on_step with the recipe told of each step first (linear_bf16_steps sets the next step's
        weights), on every rank: ranks other than 0 get no on_step of their own."""
        recipe = self.recipe
        if recipe is None or recipe.bf16_steps is None:
            return on_step

        def step_then(step: int, steps: int) -> None:
            recipe.on_step(step, steps)
            if on_step is not None:
                on_step(step, steps)

        return step_then

    def run(
        self,
        pj: PlannedJob,
        *,
        attempt: int = 1,
        on_step: Callable[[int, int], None] | None = None,
        time_limit: float | None = None,
    ) -> ManifestRecord:
        """Generate one job and stage its outputs; returns its record (status "done" with
        `handoff.staged` and, for frames_png, `handoff.staged_frames`; or "failed" with the error;
        `handoff.device_error` marks errors a fresh worker may not have, `handoff.storage_full` a disk
        or quota too full to write the video). on_step, time_limit: see `generate`. Never raises for a
        job's own failure; KeyboardInterrupt and SystemExit go through."""
        from sagevideo.attention.records import record_backends
        from sagevideo.outputs.staging import staged_path
        from sagevideo.outputs.video import VideoWriteError, write_frames_png, write_mp4

        record = base_record(self.ctx, pj)
        record.attempts, record.worker, record.started = attempt, self.worker, now_iso()
        handoff: dict[str, Any] = {}
        timings = {"load_s": round(self.load_s, 4), "denoise_s": None, "first_step_s": None, "decode_s": None,
                   "write_s": None}
        self.load_s = 0.0
        with record_backends() as calls:
            try:
                result = self.generate(pj, attempt=attempt, on_step=on_step, time_limit=time_limit)
                timings["denoise_s"], timings["decode_s"] = round(result.denoise_s, 4), round(result.decode_s, 4)
                if result.first_step_s is not None:
                    timings["first_step_s"] = round(result.first_step_s, 4)
                if result.first_step_at is not None and not self._started_timed:
                    self._started_timed = True  # a worker's start-up: its first job only
                    started = process_started()
                    timings["process_to_load_s"] = round(self._load_started_at - started, 4)
                    timings["process_to_first_step_s"] = round(result.first_step_at - started, 4)
                if self.recipe_s:
                    timings["recipe_s"], self.recipe_s = round(self.recipe_s, 4), 0.0
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
        if self.recipe is not None:
            record.recipe = self.recipe.record()
        scheduler = getattr(self.pipe, "scheduler", None)
        record.scheduler = None if scheduler is None else type(scheduler).__name__
        record.handoff = Handoff(**handoff)
        failpoints.check("job-staged", pj.job.prompt, attempt, self.rank)
        return record

    def run_rank(
        self,
        pj: PlannedJob,
        *,
        attempt: int = 1,
        on_step: Callable[[int, int], None] | None = None,
        time_limit: float | None = None,
    ) -> RankResult:
        """`run` as this process's result (a plain host is rank 0 of a group of one)."""
        record = self.run(pj, attempt=attempt, on_step=on_step, time_limit=time_limit)
        return RankResult.of_record(record, rank=self.rank)

    def close(self) -> None:
        """Remove installed attention (the pipeline object may outlive this host)."""
        if self._handle is not None:
            self._handle.remove()
            self._handle = None
        self._attention = None

    def _plan_of(self, pj: PlannedJob) -> Any:
        """The plan a job runs: its plan file's path, or with `sparse` (and no plan file: refused when
        planned) the plan `--sparse` builds (`pipelines.sparse.job_plan`), or None (uniform `pv`)."""
        job = pj.job
        if not is_sparse(job.sparse) or pj.backend is None:
            return job.plan
        from sagevideo.pipelines.sparse import job_plan

        return job_plan(self.pipe, job.pv, job.sparse, job.steps)

    def _set_attention(self, backend: str | None, pv: str | None, plan: Any = None) -> None:
        """Install attention for (backend, pv, plan) through the attention hook, only on change.
        With a plan (a path, or an `AttentionPlan`), the plan says which attention each layer and step
        runs; without, `pv` everywhere."""
        if self._attention == (backend, pv, plan):
            return
        if self._handle is not None:
            self._handle.remove()
            self._handle = None
        self._attention = None  # stays None if the hook raises: the next job tries again
        from sagevideo.pipelines.compiled import CompiledBeforeInstallWarning

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", CompiledBeforeInstallWarning)
            self._handle = self.attention(self.pipe, backend, pv, plan)
        self._attention = (backend, pv, plan)
        for warning in caught:
            if self.recipe is None or not issubclass(warning.category, CompiledBeforeInstallWarning):
                warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)
            elif not self._told_retrace:  # the blocks this host compiled itself: say what the user can do
                self._told_retrace = True
                warnings.warn(RETRACE_ON_SWITCH, CompiledBeforeInstallWarning, stacklevel=2)

    def _apply_recipe(self, steps: int) -> None:
        """The batch's recipe on the pipeline, once, after its attention is installed (install, then
        fp8 linears, compile, cache hooks: `sagevideo.pipelines.recipe.apply_recipe`); its per-job
        counters reset before every job. The seconds it took are charged to that job (recipe_s)."""
        recipe = self.ctx.recipe
        if self.recipe is None and recipe is not None and not recipe.is_plain:
            from sagevideo.pipelines.recipe import apply_recipe

            self.recipe = apply_recipe(self.pipe, recipe)
            self.recipe_s = self.recipe.apply_s
        if self.recipe is not None:
            self.recipe.start_job(self.pipe.transformer, steps=steps)

    @contextlib.contextmanager
    def _mid_denoise_failpoint(self, pj: PlannedJob, attempt: int) -> Iterator[None]:
        """The "mid-denoise" failpoint: exit at the job's second transformer call (its first with
        one step), when its peers in a sequence-parallel group have exchanged tokens already."""
        if not failpoints.fires("mid-denoise", pj.job.prompt, attempt, self.rank):
            yield
            return
        calls, at = [0], min(2, pj.job.steps)

        def exit_mid_job(module: Any, args: Any) -> None:
            calls[0] += 1
            if calls[0] >= at:
                failpoints.exit_now()

        handle = self.pipe.transformer.register_forward_pre_hook(exit_mid_job)
        try:
            yield
        finally:
            handle.remove()


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


def process_started() -> float:
    """This process's start, as `time.time()` (the interpreter's launch: imports count after it)."""
    import psutil

    return psutil.Process().create_time()
