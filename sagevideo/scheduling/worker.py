"""The Ray actor of a batch: one loaded pipeline, one job per call.

`GenerationWorker` is a plain class; `queue` turns it into an actor with `ray.remote(...)
.options(num_gpus=1 | num_cpus=1)`. Its `__init__` loads the pipeline once (and checks that the
output folder is the driver's, through a marker file the driver wrote there); load problems are
kept and reported by `ready()` instead of killing the actor, so the driver gets a clean message.
`run(job, attempt)` returns the job's `RankResult` (its manifest record, with the staged file's
name): a few hundred bytes through the object store, never frames. Denoising steps are reported to the
driver through a `ray.util.queue.Queue` (the bar's text for that step).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sagevideo.host import failpoints
from sagevideo.host.pipeline_host import ModelLoadError, PipelineHost, PlannedJob, RunContext, worker_info
from sagevideo.host.result import RankResult


def step_reporter(steps_queue: Any, pj: PlannedJob) -> Callable[[int, int], None] | None:
    """on_step for `PipelineHost.run` that puts the step's bar text on the driver's queue, or None
    without a queue. One small round trip per step (steps take seconds); a full or vanished queue
    drops the report, never the job."""
    if steps_queue is None:
        return None

    def report(step: int, steps: int) -> None:
        try:
            steps_queue.put_nowait(pj.step_text(step, steps, width=20))
        except Exception:  # Full, or the driver is gone (then this worker is about to be too)
            pass

    return report


class GenerationWorker:
    """Actor body. marker: name of a file the driver put in `ctx.out` (proves the folder is shared).
    armed: the driver's failpoints (`sagevideo.host.failpoints.armed()`; tests only).
    steps_queue: the driver's `ray.util.queue.Queue` for step progress (None: no reports)."""

    def __init__(
        self, ctx: RunContext, marker: str | None = None, armed: str | None = None, steps_queue: Any = None
    ):
        import ray

        failpoints.arm(armed)
        self.steps_queue = steps_queue
        self.info = worker_info(ray.get_runtime_context().get_node_id())
        self.error: str | None = None
        self.host: PipelineHost | None = None
        try:
            if marker is not None and not (ctx.out / marker).is_file():
                raise FileNotFoundError(
                    f"{self.info['host']} does not see the driver's output folder {ctx.out}; with several "
                    "machines, --out must be on storage every node mounts at the same path"
                )
            self.host = PipelineHost(ctx, worker=self.info)
        except Exception as err:  # reported by ready(); the driver stops this worker
            self.error = str(err) if isinstance(err, ModelLoadError) else f"{type(err).__name__}: {err}"

    def ready(self) -> dict[str, Any]:
        """Worker info (host, pid, node) and "error": None, or why it cannot run jobs."""
        return {**self.info, "error": self.error}

    def run(self, pj: PlannedJob, attempt: int) -> RankResult:
        """One job's result, its record on it (see `PipelineHost.run`)."""
        if self.host is None:
            raise RuntimeError(f"worker cannot run jobs: {self.error}")
        return self.host.run_rank(pj, attempt=attempt, on_step=step_reporter(self.steps_queue, pj))
