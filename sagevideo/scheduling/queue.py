"""The job queue over a pool of Ray workers: dispatch, retries after worker deaths, clean stops.

`run_jobs(spec, todo, ...)` is a generator: it yields (plan index, outcome) as jobs finish, each
job exactly once (`sagevideo.scheduling.spec`): `JobFinished` with rank 0's `RankResult` (its
record "done", the video staged for the driver to commit, or the job's own failure), or
`JobFailed` when no worker could finish it. The driver makes the manifest records of both.
- A worker is one actor, or (`--gpus-per-job N`) a group of N rank actors that run each job
  together (`sagevideo.scheduling.group`); either way it has at most one job in flight, and an
  idle worker takes the next queued job. A group is ready when all its ranks are, and its job is
  finished when all its ranks are; rank 0's result (and record) is the job's.
- A worker that dies mid-job (killed process, segfault, OOM kill), or reports a CUDA/out-of-
  memory error, is stopped and replaced, and its job goes back to the front of the queue for
  another worker (one it has not died on, when there is a choice). For a group, one such rank
  stops and replaces the whole group: the others' process group is broken. So does a rank that
  fails alone while the others wait for it (after `pool.STUCK_S`), and ranks that disagree (rank 0
  done, another failed). After `spec.max_attempts` runs the job is yielded as failed with every
  error, and the batch goes on.
- A job's own exception (bad numbers, NaN frames) is a failed job at once: rerunning the same
  inputs would fail the same way.
- A job still running `spec.job_timeout` seconds after it was handed out (a hung NCCL
  collective, a stuck GPU) has its worker stopped and goes back to the queue like a death.
- Workers report each denoising step on a `ray.util.queue.Queue`; the driver shows the latest
  ("<output> step/steps") in the bar's status.
- Closing the generator (the driver's Ctrl-C, or any error) stops every worker it started.

`run_jobs` sets the batch up (the Ray session, the pool's size, the output folder's marker, the
step queue, the launcher) and drives it; the parts each do one job: `pool` (the workers and
their launchers), `feed` (the dispatch, verdict and retry loop), `progress` (the step relay).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

from sagevideo.host import failpoints
from sagevideo.host.pipeline_host import PlannedJob
from sagevideo.scheduling.feed import drive
from sagevideo.scheduling.pool import Pool, SingleLauncher
from sagevideo.scheduling.progress import StepStatus
from sagevideo.scheduling.spec import JobOutcome, PoolSummary, SchedulingSpec

log = logging.getLogger("sagevideo")

__all__ = ["run_jobs"]


def run_jobs(
    spec: SchedulingSpec,
    todo: list[tuple[int, PlannedJob]],
    *,
    status: Callable[[str], None],
    echo: Callable[[str], None],
    on_pool: Callable[[PoolSummary], None] | None = None,
) -> Iterator[tuple[int, JobOutcome]]:
    """Yield (index, outcome) for every job of `todo`; see the module docstring.

    status: short progress text (the bar's postfix). echo: a line for the user. on_pool: told
    where the batch ran once the workers stop (when any became ready).
    Raises ModelLoadError when no worker could load the model, InputError when Ray cannot be joined.
    """
    import contextlib
    import dataclasses

    import ray
    from ray.util.queue import Queue

    from sagevideo.outputs.folders import run_marker
    from sagevideo.scheduling.cluster import cpu_threads, group_pool_size, pool_size, ray_session
    from sagevideo.scheduling.worker import GenerationWorker

    status("starting Ray")
    ranks = spec.ranks
    local_cpus = max(spec.workers or 1, 1) * ranks if spec.device == "cpu" else None
    with contextlib.ExitStack() as stack:  # left in reverse order, whatever raises: the marker, then Ray
        cluster = stack.enter_context(ray_session(spec.address, local_cpus=local_cpus, echo=echo))
        if ranks > 1:
            size, notes = group_pool_size(spec.workers, spec.device, cluster, ranks, len(todo))
        else:
            size, notes = pool_size(spec.workers, spec.device, cluster, len(todo))
        for note in notes:
            echo(f"sagevideo: {note}")
        # A file only the driver writes: a worker that cannot see it is not looking at --out.
        marker = stack.enter_context(run_marker(spec.out))
        # num_cpus=0: the queue's actor must not take a CPU slot a worker needs.
        steps_queue = Queue(maxsize=10_000, actor_options={"num_cpus": 0})
        ctx = spec.context
        if spec.device == "cpu":
            ctx = dataclasses.replace(ctx, cpu_threads=cpu_threads(cluster, size * ranks))
        args = (ctx, marker.name, failpoints.armed(), steps_queue)
        if ranks > 1:
            from sagevideo.scheduling.group import GroupLauncher

            launcher: Any = GroupLauncher(ranks, spec.device, args)
        else:
            resources = {"num_gpus": 1, "num_cpus": 1} if spec.device == "cuda" else {"num_cpus": 1}
            # SPREAD: one worker per node first, so a two-node cluster uses both nodes.
            launcher = SingleLauncher(
                ray.remote(GenerationWorker).options(scheduling_strategy="SPREAD", **resources), args
            )
        pool = Pool(launcher, size, spec.max_attempts)
        try:
            status(f"loading {size} worker(s)" if ranks == 1 else f"loading {size} group(s) of {ranks}")
            steps = StepStatus(steps_queue, status)
            yield from drive(spec, todo, pool, status, echo, poll_steps=steps.poll)
        finally:
            pool.stop_all()
            try:
                ray.kill(steps_queue.actor, no_restart=True)
            except Exception:  # already gone with the Ray session: nothing to free
                log.debug("could not stop the step queue", exc_info=True)
            if on_pool is not None and pool.seen:
                on_pool(PoolSummary(len(pool.seen), len({w["node"] for w in pool.seen}), ranks, cluster.name()))
