"""One job over several processes (Ulysses sequence parallelism): the degree check and a rank's host.

- `degree_problems(source, jobs, degree)`: the up-front check that `degree` ranks can split every
  job (CogVideoX only; heads and video tokens divisible by the degree), from configs alone, so a
  bad `--gpus-per-job` is refused before any model loads.
- `ShardedHost`: a `PipelineHost` for one rank. Every rank loads the pipeline once and runs every
  job with the same inputs (the seed makes the same noise everywhere); `sagevideo.parallel`
  splits the transformer's video tokens across the ranks. Rank 0 runs the job exactly as a plain
  worker does (VAE decode, staged mp4, manifest record); the other ranks stop after denoising:
  the VAE decode runs on rank 0 only. Needs the default process group
  (`sagevideo.parallel.launch.init_from_env`), whether Ray actors or `torchrun` started the ranks.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

from sagevideo.host.pipeline_host import KillHook, PipelineHost, PlannedJob, RunContext, exit_now, is_device_error
from sagevideo.jobs.specs import InputError, JobSpec, where
from sagevideo.pipelines.loading import ModelSource

# Pipelines whose transformer `sagevideo.pipelines.cogvideox.sequence_parallel.shard_cogvideox` can split.
SEQUENCE_PARALLEL_PIPELINES = ("CogVideoXPipeline",)
SEQUENCE_PARALLEL_TRANSFORMERS = ("CogVideoXTransformer3DModel",)


def transformer_config(source: ModelSource) -> SimpleNamespace:
    """What the degree check needs of the transformer's config (heads, patch sizes, class), read
    from JSON only: tiny's built-in config, or the folder's transformer/config.json."""
    if source.is_tiny:
        from sagevideo.pipelines.cogvideox.tiny import TRANSFORMER_CONFIG

        cfg = {"_class_name": "CogVideoXTransformer3DModel", **TRANSFORMER_CONFIG}
    else:
        # resolve_model already read this file, so it exists and is a JSON object.
        cfg = json.loads((source.path / "transformer" / "config.json").read_text(encoding="utf-8"))
    return SimpleNamespace(
        class_name=cfg.get("_class_name"),
        num_attention_heads=source.heads,
        patch_size=source.patch,
        patch_size_t=cfg.get("patch_size_t"),
        max_text_seq_length=cfg.get("max_text_seq_length", 226),  # the prompt length the runner pads to
    )


def degree_problems(source: ModelSource, jobs: list[tuple[JobSpec, Any]], degree: int) -> list[tuple[str, str]]:
    """(where, problem) for each resolved (job, label) that `degree` ranks cannot split.

    Raises InputError at once for what concerns the whole batch (a bad degree, a model other than
    CogVideoX, heads not divisible by the degree). degree 1 has no problems.
    """
    if isinstance(degree, bool) or not isinstance(degree, int) or degree < 1:
        raise InputError(f"--gpus-per-job {degree}: give a whole number >= 1 (1: one GPU per job, no splitting)")
    if degree == 1:
        return []
    from sagevideo.pipelines.cogvideox.sequence_parallel import check_cogvideox_degree

    config = transformer_config(source)
    supported = config.class_name in SEQUENCE_PARALLEL_TRANSFORMERS
    if source.pipeline_class not in SEQUENCE_PARALLEL_PIPELINES or not supported:
        raise InputError(
            f"--gpus-per-job {degree}: sequence parallelism splits CogVideoX transformers only; "
            f"{source.name} is a {source.pipeline_class} with a {config.class_name}. Use --gpus-per-job 1 "
            "(one GPU per job; --workers spreads jobs over GPUs)"
        )
    heads = config.num_attention_heads
    if heads % degree:  # decides for the whole batch
        usable = [d for d in range(1, heads + 1) if heads % d == 0]
        raise InputError(
            f"--gpus-per-job {degree}: the {heads} attention heads of {source.name} are not divisible by "
            f"{degree} (each rank attends over whole heads); use one of {usable}"
        )
    problems = []
    for job, label in jobs:
        # Latent size as the pipeline makes it: the VAE compresses time and space.
        latent_frames = (job.frames - 1) // source.temporal + 1
        try:
            check_cogvideox_degree(
                config, latent_frames, job.height // source.spatial, job.width // source.spatial, degree
            )
        except ValueError as err:
            problems.append(
                (where(label, "frames"), f"--gpus-per-job {degree}: {_after_colon(err)} (frames {job.frames}, "
                 f"{job.width}x{job.height} px)")
            )
    return problems


def _after_colon(err: ValueError) -> str:
    """check_degree's message without its 'Ulysses degree N: ' prefix (the option is named instead)."""
    return str(err).split(": ", 1)[-1]


class _Denoised(Exception):
    """Raised in place of the VAE decode on ranks other than 0: denoising is all they share."""


class _StopBeforeDecode:
    """The pipeline as `runner.run_job` sees it, except that decoding stops the job.

    Ranks other than 0 run the very same `run_job` as rank 0 (same arguments, so the same
    collective calls in the same order, which sequence parallelism needs) and skip the VAE."""

    def __init__(self, pipe: Any):
        self._pipe = pipe

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._pipe(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pipe, name)

    def decode_latents(self, latents: Any) -> Any:
        raise _Denoised


class ShardedHost(PipelineHost):
    """One rank of a sequence-parallel group: see the module docstring.

    rank/world: this process's rank and the group size (from `init_from_env`). kill_hook: the
    test hook; a rule for this rank exits in the middle of denoising (at the job's second
    transformer call), while the other ranks wait in a collective.
    `run` returns rank 0's full manifest record; other ranks return {"rank", "status", "error"}
    (and "_device_error" for CUDA/out-of-memory errors).
    """

    def __init__(
        self,
        ctx: RunContext,
        *,
        rank: int,
        world: int,
        worker: dict[str, Any] | None = None,
        kill_hook: KillHook | None = None,
    ):
        self.rank, self.world = rank, world
        self.rank_kill_hook = kill_hook
        super().__init__(ctx, worker=worker)  # no kill hook there: it would exit after staging

    def run(
        self, pj: PlannedJob, *, attempt: int = 1, on_step: Callable[[int, int], None] | None = None
    ) -> dict[str, Any]:
        """on_step: rank 0 only (the ranks step together); see `PipelineHost.run`."""
        with self._kill_switch(pj, attempt):
            if self.rank == 0:
                return super().run(pj, attempt=attempt, on_step=on_step)
            return self._denoise(pj)

    def _denoise(self, pj: PlannedJob) -> dict[str, Any]:
        from sagevideo.pipelines import runner

        result: dict[str, Any] = {"rank": self.rank, "status": "done", "error": None}
        try:
            self._set_attention(pj.backend, pj.job.pv, pj.job.plan)
            runner.run_job(_StopBeforeDecode(self.pipe), pj.job, text_tokens=self.ctx.source.text_tokens)
        except _Denoised:
            pass
        except Exception as err:  # reported to the driver, which decides for the whole group
            result.update(status="failed", error=f"{type(err).__name__}: {err}")
            if is_device_error(err):
                result["_device_error"] = True
        return result

    def _set_attention(self, backend: str | None, pv: str | None, plan: str | None = None) -> None:
        """Install Ulysses with sagevideo attention for (backend, pv, plan); attention "full"
        (backend None) runs SDPA inside Ulysses, as sharding needs the sagevideo processor."""
        from sagevideo.pipelines.cogvideox.sequence_parallel import shard_cogvideox
        from sagevideo.pipelines.plans import AttentionPlan

        if self._attention == (backend, pv, plan):
            return
        if self._handle is not None:
            self._handle.remove()
            self._handle = None
        self._attention = None  # stays None if sharding raises: the next job tries again
        if backend is None:
            self._handle = shard_cogvideox(self.pipe, plan=AttentionPlan.uniform("full"), backend="sdpa")
        else:
            self._handle = shard_cogvideox(self.pipe, plan=plan, pv=pv, backend=backend)
        self._attention = (backend, pv, plan)

    @contextlib.contextmanager
    def _kill_switch(self, pj: PlannedJob, attempt: int) -> Iterator[None]:
        if self.rank_kill_hook is None or not self.rank_kill_hook.fires(pj, attempt, self.rank):
            yield
            return
        calls, at = [0], min(2, pj.job.steps)  # the 2nd step: peers have exchanged tokens already

        def exit_mid_job(module: Any, args: Any) -> None:
            calls[0] += 1
            if calls[0] >= at:
                exit_now()

        handle = self.pipe.transformer.register_forward_pre_hook(exit_mid_job)
        try:
            yield
        finally:
            handle.remove()
