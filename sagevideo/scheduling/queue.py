"""The job queue over a pool of Ray workers: dispatch, retries after worker deaths, clean stops.

`run_jobs(plan, todo, ...)` is a generator: it yields (plan index, record) as jobs finish, each
job exactly once, with status "done" (the video staged, for the driver to commit) or "failed".
- A worker is one actor, or (`--gpus-per-job N`) a group of N rank actors that run each job
  together (`sagevideo.scheduling.group`); either way it has at most one job in flight, and an
  idle worker takes the next queued job. A group is ready when all its ranks are, and its job is
  finished when all its ranks are; rank 0's record is the job's.
- A worker that dies mid-job (killed process, segfault, OOM kill), or reports a CUDA/out-of-
  memory error, is stopped and replaced, and its job goes back to the front of the queue for
  another worker (one it has not died on, when there is a choice). For a group, one such rank
  stops and replaces the whole group: the others' process group is broken. So does a rank that
  fails alone while the others wait for it (after `STUCK_S`), and ranks that disagree (rank 0
  done, another failed). After `plan.max_attempts` runs the job is yielded as failed with every
  error, and the batch goes on.
- A job's own exception (bad numbers, NaN frames) is a failed job at once: rerunning the same
  inputs would fail the same way.
- A job still running `plan.job_timeout` seconds after it was handed out (a hung NCCL
  collective, a stuck GPU) has its worker stopped and goes back to the queue like a death.
- Workers report each denoising step on a `ray.util.queue.Queue`; the driver shows the latest
  ("<output> step/steps") in the bar's status.
- Closing the generator (the driver's Ctrl-C, or any error) stops every worker it started.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from sagevideo.errors import first_line
from sagevideo.host import failpoints
from sagevideo.host.pipeline_host import ModelLoadError, PlannedJob, base_record
from sagevideo.outputs.manifest import ManifestRecord, now_iso

log = logging.getLogger("sagevideo")
WAIT_S = 0.5  # ray.wait slices: Ctrl-C is handled between them
STUCK_S = 30.0  # a rank that failed alone: how long its peers may take to fail too before the group is stopped
STOP_WAIT_S = 5.0  # after stopping a worker mid-job: how long to wait for its processes to be gone


@dataclass
class _Task:
    index: int
    job: PlannedJob
    attempt: int = 1
    retries: list[dict[str, Any]] = field(default_factory=list)
    died_on: set[int] = field(default_factory=set)  # worker numbers this job's worker died on


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
    import contextlib
    import dataclasses

    import ray
    from ray.util.queue import Queue

    from sagevideo.outputs.folders import run_marker
    from sagevideo.scheduling.cluster import cpu_threads, group_pool_size, pool_size, ray_session
    from sagevideo.scheduling.worker import GenerationWorker

    status("starting Ray")
    ranks = plan.gpus_per_job
    local_cpus = max(plan.workers or 1, 1) * ranks if plan.device == "cpu" else None
    with contextlib.ExitStack() as stack:  # left in reverse order, whatever raises: the marker, then Ray
        cluster = stack.enter_context(ray_session(plan.address, local_cpus=local_cpus, echo=echo))
        if ranks > 1:
            size, notes = group_pool_size(plan.workers, plan.device, cluster, ranks, len(todo))
        else:
            size, notes = pool_size(plan.workers, plan.device, cluster, len(todo))
        for note in notes:
            echo(f"sagevideo: {note}")
        # A file only the driver writes: a worker that cannot see it is not looking at --out.
        marker = stack.enter_context(run_marker(plan.out))
        # num_cpus=0: the queue's actor must not take a CPU slot a worker needs.
        steps_queue = Queue(maxsize=10_000, actor_options={"num_cpus": 0})
        ctx = plan.context()
        if plan.device == "cpu":
            ctx = dataclasses.replace(ctx, cpu_threads=cpu_threads(cluster, size * ranks))
        args = (ctx, marker.name, failpoints.armed(), steps_queue)
        if ranks > 1:
            from sagevideo.scheduling.group import GroupLauncher

            launcher: Any = GroupLauncher(ranks, plan.device, args)
        else:
            resources = {"num_gpus": 1, "num_cpus": 1} if plan.device == "cuda" else {"num_cpus": 1}
            # SPREAD: one worker per node first, so a two-node cluster uses both nodes.
            launcher = SingleLauncher(
                ray.remote(GenerationWorker).options(scheduling_strategy="SPREAD", **resources), args
            )
        pool = _Pool(launcher, size, plan.max_attempts)
        try:
            status(f"loading {size} worker(s)" if ranks == 1 else f"loading {size} group(s) of {ranks}")
            steps = _StepStatus(steps_queue, status)
            yield from _drive(plan, todo, pool, status, echo, poll_steps=steps.poll)
        finally:
            pool.stop_all()
            try:
                ray.kill(steps_queue.actor, no_restart=True)
            except Exception:  # already gone with the Ray session: nothing to free
                log.debug("could not stop the step queue", exc_info=True)
            if report is not None and pool.seen:
                nodes = len({w["node"] for w in pool.seen})
                kind = "Ray worker(s)" if ranks == 1 else f"Ray group(s) of {ranks} ranks"
                report.workers = f"{len(pool.seen)} {kind} on {nodes} node(s) of {cluster.name()}"


@dataclass(eq=False)  # compared and hashed by identity: it sits in lists and dicts of the pool
class _Worker:
    """One plain worker (one actor) or one group (rank actors, rank 0 first, and their placement
    group). pending: refs of the calls in flight (its ranks' setup or run) -> rank; results: rank
    -> what its call returned (or a `_Death`); failed_at: when a rank failed while others ran on."""

    number: int
    actors: list[Any]
    group: Any = None
    info: dict[str, Any] = field(default_factory=dict)
    task: _Task | None = None
    pending: dict[Any, int] = field(default_factory=dict)
    results: dict[int, Any] = field(default_factory=dict)
    failed_at: float | None = None
    started: float = 0.0  # time.monotonic() when its current job was handed out

    def who(self, rank: int | None = None) -> str:
        info = self.info
        name = f"{info.get('host')}:{info.get('pid')}" if info else f"#{self.number}"
        if len(self.actors) > 1:
            return f"group {name}" if rank is None else f"rank {rank} of group {name}"
        return f"worker {name}"


@dataclass
class _Death:
    """A rank (or worker) that died or could not run: the group must be replaced."""

    reason: str


class SingleLauncher:
    """Plain workers: one `GenerationWorker` actor each (see `GroupLauncher` for groups)."""

    def __init__(self, actor_class: Any, args: tuple):
        """actor_class: `ray.remote(GenerationWorker).options(...)`; args: its constructor's."""
        self.actor_class = actor_class
        self.args = args

    def start(self) -> tuple[list[Any], Any, list[Any]]:
        actor = self.actor_class.remote(*self.args)
        return [actor], None, [actor.ready.remote()]

    def run(self, actors: list[Any], pj: PlannedJob, attempt: int) -> list[Any]:
        return [actors[0].run.remote(pj, attempt)]

    def stop(self, actors: list[Any], group: Any) -> None:
        import ray

        ray.kill(actors[0], no_restart=True)


class _Pool:
    """The workers: starting (waiting for every rank's `ready`/`setup`), idle, busy. Replacements
    are bounded so a model that kills every worker cannot loop forever."""

    def __init__(self, launcher: Any, size: int, max_attempts: int):
        """launcher: `SingleLauncher` or `group.GroupLauncher`."""
        self.launcher = launcher
        self.size = size
        self.starts_left = size * (1 + max_attempts)
        self.starting: dict[Any, _Worker] = {}  # a rank's ready()/setup() ref -> worker
        self.idle: list[_Worker] = []
        self.busy: dict[Any, _Worker] = {}  # a rank's run() ref -> worker (worker.task: its job)
        self.seen: list[dict[str, Any]] = []  # info of every worker that became ready
        self.load_errors: list[str] = []
        self.number = 0
        for _ in range(size):
            self.start()

    def workers(self) -> list[_Worker]:
        """Every worker started and not stopped, each once."""
        return list(dict.fromkeys([*self.starting.values(), *self.idle, *self.busy.values()]))

    @property
    def alive(self) -> int:
        return len(self.workers())

    @property
    def ready(self) -> int:
        return len(self.idle) + len(self.busy_workers())

    def start(self) -> bool:
        if self.starts_left <= 0:
            return False
        self.starts_left -= 1
        self.number += 1
        actors, group, refs = self.launcher.start()
        worker = _Worker(self.number, actors, group)
        for rank, ref in enumerate(refs):
            worker.pending[ref] = rank
            self.starting[ref] = worker
        return True

    def dispatch(self, worker: _Worker, task: _Task) -> None:
        self.idle.remove(worker)
        worker.task, worker.results, worker.failed_at, worker.started = task, {}, None, time.monotonic()
        for rank, ref in enumerate(self.launcher.run(worker.actors, task.job, task.attempt)):
            worker.pending[ref] = rank
            self.busy[ref] = worker

    def stop(self, worker: _Worker) -> list[Any]:
        """Kill the worker (every rank) and forget it; returns the refs it still had in flight."""
        try:
            self.launcher.stop(worker.actors, worker.group)
        except Exception:  # already gone
            log.debug("could not stop %s", worker.who(), exc_info=True)
        left = list(worker.pending)
        for ref in left:
            self.starting.pop(ref, None)
            self.busy.pop(ref, None)
        worker.pending = {}
        if worker in self.idle:
            self.idle.remove(worker)
        return left

    def stop_all(self, wait_s: float = STOP_WAIT_S) -> None:
        """Kill every worker, then wait (up to wait_s) until those that were running a job are
        gone: `ray.kill` is asynchronous, and the driver removes their half-written files next."""
        running = list(self.busy)
        for worker in self.workers():
            self.stop(worker)
        _wait_gone(running, wait_s)

    def stuck(self, now: float) -> list[_Worker]:
        """Busy groups where a rank failed alone more than STUCK_S ago (its peers wait forever)."""
        return [w for w in self.busy_workers() if w.failed_at is not None and now - w.failed_at > STUCK_S]

    def busy_workers(self) -> list[_Worker]:
        """Workers with a job in flight, each once (a group has one ref per rank)."""
        return list(dict.fromkeys(self.busy.values()))

    def overdue(self, now: float, limit_s: float | None) -> list[_Worker]:
        """Busy workers whose job was handed out more than limit_s ago (none without a limit)."""
        if limit_s is None:
            return []
        return [w for w in self.busy_workers() if now - w.started > limit_s]


class _StepStatus:
    """Shows the newest step report of the running jobs as the bar's status text."""

    def __init__(self, steps_queue: Any, status: Callable[[str], None]):
        self.queue = steps_queue
        self.status = status

    def poll(self, running: int) -> None:
        """Show the newest step text the workers reported since the last poll."""
        try:
            count = self.queue.qsize()
            reports = self.queue.get_nowait_batch(count) if count else []
        except Exception:  # progress is cosmetic; the queue's actor may be gone at shutdown
            log.debug("could not read step reports", exc_info=True)
            return
        if reports:
            self.status(f"{running} running, {reports[-1]}" if running > 1 else reports[-1])


def _wait_gone(refs: list[Any], wait_s: float) -> None:
    """Each in-flight ref resolves (with ActorDiedError) once its process is gone."""
    import ray

    if not refs:
        return
    try:
        ray.wait(refs, num_returns=len(refs), timeout=wait_s)
    except Exception:
        log.debug("waiting for stopped workers failed", exc_info=True)


def _drive(
    plan: Any,
    todo: list[tuple[int, PlannedJob]],
    pool: _Pool,
    status: Callable[[str], None],
    echo: Callable[[str], None],
    *,
    poll_steps: Callable[[int], None] | None = None,
) -> Iterator:
    """The driver loop; poll_steps(running jobs) shows the workers' step reports (if any)."""
    import ray

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
                status(f"{pool.ready}/{pool.size} workers ready")
                continue
            worker = pool.busy.pop(ref, None)
            if worker is None:  # its worker was stopped meanwhile
                continue
            rank = worker.pending.pop(ref)
            worker.results[rank] = _outcome(ref, worker, rank)
            verdict = _verdict(worker)
            if verdict is not None:
                yield from _finish(plan, queue, pool, worker, *verdict, echo=echo)
        for worker in pool.stuck(time.monotonic()):
            failed = sorted(r for r, out in worker.results.items() if _failed_result(out))
            reason = (
                f"{worker.who(failed[0])} failed ({worker.results[failed[0]].get('error')}) while ranks "
                f"{sorted(worker.pending.values())} waited for it; group stopped after {STUCK_S:g} s"
            )
            yield from _finish(plan, queue, pool, worker, None, reason, echo=echo)
        for worker in pool.overdue(time.monotonic(), plan.job_timeout):
            reason = (
                f"{worker.who()} still ran job {worker.task.job.job_id} after --job-timeout "
                f"{plan.job_timeout:g} s; stopped"
            )
            yield from _finish(plan, queue, pool, worker, None, reason, echo=echo)
        if poll_steps is not None:
            poll_steps(len(pool.busy_workers()))


def _outcome(ref: Any, worker: _Worker, rank: int) -> Any:
    """What a rank's run() gave: its record/status, or a `_Death`."""
    import ray
    from ray.exceptions import RayActorError, RayTaskError

    try:
        return ray.get(ref)
    except RayActorError as err:
        return _Death(f"{worker.who(rank)} died during the job ({first_line(err)})")
    except RayTaskError as err:  # run() raised: the worker is unusable, the job is not to blame
        return _Death(f"{worker.who(rank)} failed: {first_line(err)}")


def _failed_result(out: Any) -> bool:
    return isinstance(out, (dict, ManifestRecord)) and out.get("status") == "failed"


def _device_error(out: Any) -> bool:
    """Rank 0's record says so in its handoff; another rank's {"rank", "status", "error"} by a key."""
    if isinstance(out, ManifestRecord):
        return out.handoff is not None and out.handoff.device_error
    return bool(out.get("_device_error"))


def _verdict(worker: _Worker) -> tuple[dict[str, Any] | None, str | None] | None:
    """(record, None) when the job is finished, (None, why) when the worker must be replaced and
    the job retried, None while ranks are still running."""
    several = len(worker.actors) > 1
    for rank, out in sorted(worker.results.items()):
        if isinstance(out, _Death):
            return None, out.reason
        if _device_error(out):
            return None, f"{worker.who(rank)}: {out.get('error')}" if several else out.get("error")
    if worker.pending:
        if worker.failed_at is None and any(_failed_result(out) for out in worker.results.values()):
            worker.failed_at = time.monotonic()  # the others may be waiting for it in a collective
        return None
    record = worker.results[0]
    disagree = [rank for rank, out in sorted(worker.results.items()) if rank and _failed_result(out)]
    if disagree and record.get("status") == "done":
        rank = disagree[0]
        return None, f"{worker.who(rank)} failed ({worker.results[rank].get('error')}) where rank 0 did not"
    return record, None


def _finish(plan: Any, queue: deque, pool: _Pool, worker: _Worker, record, died: str | None, *, echo) -> Iterator:
    """A worker's job ended: yield its record, or stop the worker and requeue (or fail) the job."""
    task = worker.task
    worker.task, worker.results, worker.failed_at = None, {}, None
    if died is None:
        record.retries = task.retries
        pool.idle.append(worker)
        yield task.index, record
        return
    # Dead already, or its GPU state is suspect, or (a group) its other ranks are stuck: stop all
    # of it, and let a live rank 0 finish dying before its staged file is removed.
    _wait_gone(pool.stop(worker), STOP_WAIT_S)
    task.job.remove_leftovers(plan.out)
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
        pool.dispatch(choice, task)


def _on_ready(ref: Any, pool: _Pool, echo) -> None:
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


def _failed(plan: Any, task: _Task, error: str) -> ManifestRecord:
    """The record of a job that never finished on any worker."""
    record = base_record(plan.context(), task.job)
    record.status, record.error = "failed", error
    record.attempts, record.retries = max(task.attempt, len(task.retries)), task.retries
    record.worker = task.retries[-1]["worker"] if task.retries else None
    record.backends, record.created = {"counts": {}, "fallbacks": {}}, now_iso()
    return record
