"""The job queue over a pool of Ray workers: dispatch, retries after worker deaths, clean stops.

`run_jobs(plan, todo, ...)` is a generator: it yields (plan index, record) as jobs finish, each
job exactly once, with status "done" (the video staged, for the driver to commit) or "failed".
- Each worker has at most one job in flight; an idle worker takes the next queued job.
- A worker that dies mid-job (killed process, segfault, OOM kill), or reports a CUDA/out-of-
  memory error, is stopped and replaced, and its job goes back to the front of the queue for
  another worker (one it has not died on, when there is a choice). After `plan.max_attempts`
  runs the job is yielded as failed with every error, and the batch goes on.
- A job's own exception (bad numbers, NaN frames) is a failed job at once: rerunning the same
  inputs would fail the same way.
- Closing the generator (the driver's Ctrl-C, or any error) stops every worker it started.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from sagevideo.api.execute import KILL_HOOK_ENV, ModelLoadError, PlannedJob, base_record
from sagevideo.outputs.manifest import now_iso

log = logging.getLogger("sagevideo")
WAIT_S = 0.5  # ray.wait slices: Ctrl-C is handled between them


@dataclass
class _Task:
    index: int
    job: PlannedJob
    attempt: int = 1
    retries: list[dict[str, Any]] = field(default_factory=list)
    died_on: set[int] = field(default_factory=set)  # worker numbers this job's worker died on


@dataclass
class _Worker:
    number: int
    actor: Any
    info: dict[str, Any] = field(default_factory=dict)


def run_jobs(
    plan: Any,
    todo: list[tuple[int, PlannedJob]],
    *,
    status: Callable[[str], None],
    echo: Callable[[str], None],
    report: Any = None,
) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield (index, record) for every job of `todo`; see the module docstring.

    plan: a `BatchPlan` with use_ray set. status: short progress text (the bar's postfix).
    echo: a line for the user. report: a `BatchReport` whose `workers` gets where the batch ran.
    Raises ModelLoadError when no worker could load the model, InputError when Ray cannot be joined.
    """
    import os
    import secrets

    import ray

    from sagevideo.scheduling.cluster import pool_size, ray_session
    from sagevideo.scheduling.worker import GenerationWorker

    status("starting Ray")
    local_cpus = max(plan.workers or 1, 1) if plan.device == "cpu" else None
    with ray_session(plan.address, local_cpus=local_cpus) as cluster:
        size, notes = pool_size(plan.workers, plan.device, cluster, len(todo))
        for note in notes:
            echo(f"sagevideo: {note}")
        # A file only the driver writes: a worker that cannot see it is not looking at --out.
        marker = plan.out / f".sagevideo-run-{secrets.token_hex(4)}"
        marker.touch()
        resources = {"num_gpus": 1, "num_cpus": 1} if plan.device == "cuda" else {"num_cpus": 1}
        # SPREAD: one worker per node first, so a two-node cluster uses both nodes.
        actor_class = ray.remote(GenerationWorker).options(scheduling_strategy="SPREAD", **resources)
        pool = _Pool(actor_class, (plan.context(), marker.name, os.environ.get(KILL_HOOK_ENV)), size, plan.max_attempts)
        try:
            status(f"loading {size} worker(s)")
            yield from _drive(plan, todo, pool, status, echo)
        finally:
            pool.stop_all()
            marker.unlink(missing_ok=True)
            if report is not None and pool.seen:
                nodes = len({w["node"] for w in pool.seen})
                report.workers = f"{len(pool.seen)} Ray worker(s) on {nodes} node(s)"


class _Pool:
    """The actors: starting (waiting for `ready`), idle, busy. Replacements are bounded so a
    model that kills every worker cannot loop forever."""

    def __init__(self, actor_class: Any, args: tuple, size: int, max_attempts: int):
        """actor_class: `ray.remote(GenerationWorker).options(...)`; args: its constructor's."""
        self.actor_class = actor_class
        self.args = args
        self.size = size
        self.starts_left = size * (1 + max_attempts)
        self.starting: dict[Any, _Worker] = {}  # ready() ref -> worker
        self.idle: list[_Worker] = []
        self.busy: dict[Any, tuple[_Worker, _Task]] = {}  # run() ref -> (worker, task)
        self.seen: list[dict[str, Any]] = []  # info of every worker that became ready
        self.load_errors: list[str] = []
        self.number = 0
        for _ in range(size):
            self.start()

    @property
    def alive(self) -> int:
        return len(self.starting) + len(self.idle) + len(self.busy)

    def start(self) -> bool:
        if self.starts_left <= 0:
            return False
        self.starts_left -= 1
        self.number += 1
        actor = self.actor_class.remote(*self.args)
        self.starting[actor.ready.remote()] = _Worker(self.number, actor)
        return True

    def stop(self, worker: _Worker) -> None:
        import ray

        try:
            ray.kill(worker.actor, no_restart=True)
        except Exception:  # already gone
            log.debug("could not kill worker %s", worker.number, exc_info=True)

    def stop_all(self, wait_s: float = 5.0) -> None:
        """Kill every worker, then wait (up to wait_s) until those that were running a job are
        gone: `ray.kill` is asynchronous, and the driver removes their half-written files next."""
        import ray

        running = list(self.busy)
        for worker in [*self.starting.values(), *self.idle, *(w for w, _ in self.busy.values())]:
            self.stop(worker)
        self.starting.clear()
        self.idle.clear()
        self.busy.clear()
        if running:
            try:  # each in-flight ref resolves (with ActorDiedError) once its worker process is gone
                ray.wait(running, num_returns=len(running), timeout=wait_s)
            except Exception:
                log.debug("waiting for stopped workers failed", exc_info=True)


def _drive(plan: Any, todo: list[tuple[int, PlannedJob]], pool: _Pool, status, echo) -> Iterator:
    import ray
    from ray.exceptions import RayActorError, RayTaskError

    from sagevideo.outputs.staging import remove_leftovers

    queue = deque(_Task(index, pj) for index, pj in todo)
    while queue or pool.busy:
        _dispatch(queue, pool)
        if not pool.busy and not pool.starting:  # no worker left and none coming
            if not pool.seen:
                raise ModelLoadError(pool.load_errors[-1] if pool.load_errors else "no Ray worker could start")
            reason = f"no worker left to run it ({pool.load_errors[-1] if pool.load_errors else 'all died'})"
            while queue:
                task = queue.popleft()
                yield task.index, _failed(plan, task, reason)
            return
        ready, _ = ray.wait([*pool.busy, *pool.starting], num_returns=1, timeout=WAIT_S)
        for ref in ready:
            if ref in pool.starting:
                _on_ready(ref, pool, echo)
                status(f"{len(pool.idle) + len(pool.busy)}/{pool.size} workers ready")
                continue
            worker, task = pool.busy.pop(ref)
            try:
                record = ray.get(ref)
            except RayActorError as err:
                died = f"worker {_who(worker)} died during the job ({_first_line(err)})"
                record = None
            except RayTaskError as err:  # run() raised: the worker is unusable, the job is not to blame
                died = f"worker {_who(worker)} failed: {_first_line(err)}"
                record = None
            else:
                died = record.get("error") if record.get("_device_error") else None
            if died is None:
                record["retries"] = task.retries
                pool.idle.append(worker)
                yield task.index, record
                continue
            pool.stop(worker)  # dead already, or its GPU state is suspect
            remove_leftovers(plan.out / task.job.output)
            task.retries.append({"attempt": task.attempt, "error": died, "worker": worker.info})
            task.died_on.add(worker.number)
            if task.attempt < plan.max_attempts:
                echo(f"sagevideo: {died}; retrying job {task.job.job_id} ({task.attempt + 1}/{plan.max_attempts})")
                task.attempt += 1
                queue.appendleft(task)
            else:
                yield task.index, _failed(plan, task, f"{died}; gave up after {task.attempt} attempt(s)")
            if queue and pool.alive < pool.size:
                pool.start()


def _dispatch(queue: deque, pool: _Pool) -> None:
    """Give queued jobs to idle workers; a retried job prefers a worker it has not died on."""
    while queue and pool.idle:
        task = queue.popleft()
        choice = next((w for w in pool.idle if w.number not in task.died_on), pool.idle[0])
        pool.idle.remove(choice)
        pool.busy[choice.actor.run.remote(task.job, task.attempt)] = (choice, task)


def _on_ready(ref: Any, pool: _Pool, echo) -> None:
    import ray
    from ray.exceptions import RayError

    worker = pool.starting.pop(ref)
    try:
        info = ray.get(ref)
    except RayError as err:
        info = {"error": f"worker died while loading ({_first_line(err)})"}
    if info.get("error"):
        pool.load_errors.append(info["error"])
        pool.stop(worker)
        echo(f"sagevideo: a Ray worker could not start: {info['error']}")
        return
    worker.info = {k: info[k] for k in ("host", "pid", "node")}
    pool.seen.append(worker.info)
    pool.idle.append(worker)


def _failed(plan: Any, task: _Task, error: str) -> dict[str, Any]:
    """The record of a job that never finished on any worker."""
    record = base_record(plan.context(), task.job)
    last = task.retries[-1]["worker"] if task.retries else None
    record.update(
        status="failed",
        error=error,
        attempts=max(task.attempt, len(task.retries)),
        retries=task.retries,
        worker=last,
        backends={"counts": {}, "fallbacks": {}},
        created=now_iso(),
    )
    return record


def _who(worker: _Worker) -> str:
    info = worker.info
    return f"{info.get('host')}:{info.get('pid')}" if info else f"#{worker.number}"


def _first_line(err: BaseException) -> str:
    """Ray's errors run to dozens of lines; the first meaningful one names what happened."""
    for line in str(err).splitlines():
        line = line.strip()
        if line and not line.startswith(("ray::", "Traceback")):
            return line[:300]
    return type(err).__name__
