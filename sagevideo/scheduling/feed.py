"""The feed loop: hand queued jobs to idle workers, read what each rank's call gave, decide.

`drive(spec, todo, pool, status, echo)` yields (plan index, outcome) as jobs end: a worker
that finished a job goes back to idle and the job's `JobFinished` out; a death, a device
error, a rank stuck after its peer failed, ranks that disagree or a job past its time stop the
worker and requeue the job at the front (on a worker it has not died on, when there is a choice)
until `spec.max_attempts`, then `JobFailed`. See `sagevideo.scheduling.queue` for the rules.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from sagevideo.errors import first_line
from sagevideo.host.pipeline_host import ModelLoadError, PlannedJob
from sagevideo.host.result import RankResult
from sagevideo.scheduling.pool import STOP_WAIT_S, Death, Pool, Task, Worker, wait_gone
from sagevideo.scheduling.spec import JobFailed, JobFinished, JobOutcome, SchedulingSpec

WAIT_S = 0.5  # ray.wait slices: Ctrl-C is handled between them

__all__ = ["WAIT_S", "drive"]


def drive(
    spec: SchedulingSpec,
    todo: list[tuple[int, PlannedJob]],
    pool: Pool,
    status: Callable[[str], None],
    echo: Callable[[str], None],
    *,
    poll_steps: Callable[[int], None] | None = None,
) -> Iterator:
    """The driver loop; poll_steps(running jobs) shows the workers' step reports (if any)."""
    import ray

    queue = deque(Task(index, pj) for index, pj in todo)
    while queue or pool.busy:
        _dispatch(queue, pool)
        if not pool.busy and not pool.starting:  # no worker left and none coming
            if not pool.seen:
                raise ModelLoadError(pool.load_errors[-1] if pool.load_errors else "no Ray worker could start")
            reason = f"no worker left to run it ({pool.load_errors[-1] if pool.load_errors else 'all died'})"
            while queue:
                task = queue.popleft()
                yield task.index, _failed(task, reason)
            return
        ready, _ = ray.wait([*pool.busy, *pool.starting], num_returns=1, timeout=WAIT_S)
        for ref in ready:
            if ref in pool.starting:
                _on_ready(ref, pool, echo)
                status(f"{pool.ready}/{pool.size} workers ready")
                continue
            worker = pool.busy.pop(ref, None)
            if worker is None:  # its worker was stopped meanwhile
                continue
            rank = worker.pending.pop(ref)
            worker.results[rank] = _outcome(ref, worker, rank)
            verdict = _verdict(worker)
            if verdict is not None:
                yield from _finish(spec, queue, pool, worker, *verdict, echo=echo)
        for worker in pool.stuck(time.monotonic()):
            failed = sorted(r for r, out in worker.results.items() if _failed_result(out))
            reason = (
                f"{worker.who(failed[0])} failed ({worker.results[failed[0]].error}) while ranks "
                f"{sorted(worker.pending.values())} waited for it; group stopped after {pool.stuck_s:g} s"
            )
            yield from _finish(spec, queue, pool, worker, None, reason, echo=echo)
        for worker in pool.overdue(time.monotonic(), spec.job_timeout):
            reason = (
                f"{worker.who()} still ran job {worker.task.job.job_id} after --job-timeout "
                f"{spec.job_timeout:g} s; stopped"
            )
            yield from _finish(spec, queue, pool, worker, None, reason, echo=echo)
        if poll_steps is not None:
            poll_steps(len(pool.busy_workers()))


def _outcome(ref: Any, worker: Worker, rank: int) -> RankResult | Death:
    """What a rank's run() gave: its `RankResult`, or a `Death`."""
    import ray
    from ray.exceptions import RayActorError, RayTaskError

    try:
        return ray.get(ref)
    except RayActorError as err:
        return Death(f"{worker.who(rank)} died during the job ({first_line(err)})")
    except RayTaskError as err:  # run() raised: the worker is unusable, the job is not to blame
        return Death(f"{worker.who(rank)} failed: {first_line(err)}")


def _failed_result(out: Any) -> bool:
    return isinstance(out, RankResult) and out.failed


def _verdict(worker: Worker) -> tuple[RankResult | None, str | None] | None:
    """(rank 0's result, None) when the job is finished, (None, why) when the worker must be
    replaced and the job retried, None while ranks are still running."""
    several = len(worker.actors) > 1
    for rank, out in sorted(worker.results.items()):
        if isinstance(out, Death):
            return None, out.reason
        if out.device_error:
            return None, f"{worker.who(rank)}: {out.error}" if several else out.error
    if worker.pending:
        if worker.failed_at is None and any(_failed_result(out) for out in worker.results.values()):
            worker.failed_at = time.monotonic()  # the others may be waiting for it in a collective
        return None
    first = worker.results[0]
    disagree = [rank for rank, out in sorted(worker.results.items()) if rank and _failed_result(out)]
    if disagree and not first.failed:
        rank = disagree[0]
        return None, f"{worker.who(rank)} failed ({worker.results[rank].error}) where rank 0 did not"
    return first, None


def _finish(
    spec: SchedulingSpec, queue: deque, pool: Pool, worker: Worker, result: RankResult | None, died: str | None,
    *, echo: Callable[[str], None],
) -> Iterator[tuple[int, JobOutcome]]:
    """A worker's job ended: yield its outcome, or stop the worker and requeue (or fail) the job."""
    task = worker.task
    worker.task, worker.results, worker.failed_at = None, {}, None
    if died is None:
        pool.idle.append(worker)
        yield task.index, JobFinished(result, tuple(task.retries))
        return
    # Dead already, or its GPU state is suspect, or (a group) its other ranks are stuck: stop all
    # of it, and let a live rank 0 finish dying before its staged file is removed.
    wait_gone(pool.stop(worker), STOP_WAIT_S)
    task.job.remove_leftovers(spec.out)
    task.retries.append({"attempt": task.attempt, "error": died, "worker": worker.info})
    task.died_on.add(worker.number)
    if task.attempt < spec.max_attempts:
        echo(f"sagevideo: {died}; retrying job {task.job.job_id} ({task.attempt + 1}/{spec.max_attempts})")
        task.attempt += 1
        queue.appendleft(task)
    else:
        yield task.index, _failed(task, f"{died}; gave up after {task.attempt} attempt(s)")
    if queue and pool.alive < pool.size:
        pool.start()


def _dispatch(queue: deque, pool: Pool) -> None:
    """Give queued jobs to idle workers; a retried job prefers a worker it has not died on."""
    while queue and pool.idle:
        task = queue.popleft()
        choice = next((w for w in pool.idle if w.number not in task.died_on), pool.idle[0])
        pool.dispatch(choice, task)


def _on_ready(ref: Any, pool: Pool, echo) -> None:
    """A rank's ready()/setup() answered: an error stops the whole worker; the last rank makes it idle."""
    import ray
    from ray.exceptions import RayError

    worker = pool.starting.pop(ref)
    rank = worker.pending.pop(ref)
    try:
        info = ray.get(ref)
    except RayError as err:
        who = f"rank {rank}" if len(worker.actors) > 1 else "worker"
        info = {"error": f"{who} died while loading ({first_line(err)})"}
    if info.get("error"):
        pool.load_errors.append(info["error"])
        pool.stop(worker)
        echo(f"sagevideo: a Ray worker could not start: {info['error']}")
        return
    worker.results[rank] = info
    if worker.pending:
        return  # other ranks still loading
    first = worker.results[0]
    worker.results = {}
    worker.info = {k: first[k] for k in ("host", "pid", "node")}
    if len(worker.actors) > 1:
        worker.info["ranks"] = len(worker.actors)
    pool.seen.append(worker.info)
    pool.idle.append(worker)


def _failed(task: Task, error: str) -> JobFailed:
    """A job that never finished on any worker: why, its runs, and the last worker that had it."""
    return JobFailed(
        error=error, attempts=max(task.attempt, len(task.retries)), retries=tuple(task.retries),
        worker=task.retries[-1]["worker"] if task.retries else None,
    )
