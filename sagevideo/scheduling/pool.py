"""The workers of a batch: a pool of plain workers or rank groups, starting, idle, busy, stopped.

A worker is one actor (`SingleLauncher`) or a group of rank actors (`sagevideo.scheduling.group.
GroupLauncher`); the pool starts them through its launcher, knows which are loading, idle or
running a job (`Worker.task`), stops a worker (every rank, and its placement group) and bounds
how many replacements it starts, so a model that kills every worker cannot loop forever. What
a worker's job came to, and what happens next, is the feed loop's (`sagevideo.scheduling.feed`).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from sagevideo.host.pipeline_host import PlannedJob
from sagevideo.host.result import RankResult
from sagevideo.outputs.manifest import Retry

log = logging.getLogger("sagevideo")
STUCK_S = 30.0  # a rank that failed alone: how long its peers may take to fail too before the group is stopped
STOP_WAIT_S = 5.0  # after stopping a worker mid-job: how long to wait for its processes to be gone

__all__ = ["STOP_WAIT_S", "STUCK_S", "Death", "Pool", "SingleLauncher", "Task", "Worker", "wait_gone"]


@dataclass
class Task:
    """A job in the queue: its plan index, its attempt, the deaths it saw and where."""

    index: int
    job: PlannedJob
    attempt: int = 1
    retries: list[Retry] = field(default_factory=list)
    died_on: set[int] = field(default_factory=set)  # worker numbers this job's worker died on


@dataclass(eq=False)  # compared and hashed by identity: it sits in lists and dicts of the pool
class Worker:
    """One plain worker (one actor) or one group (rank actors, rank 0 first, and their placement
    group). pending: refs of the calls in flight (its ranks' setup or run) -> rank; results: rank
    -> what its call returned (or a `Death`); failed_at: when a rank failed while others ran on."""

    number: int
    actors: list[Any]
    group: Any = None
    info: dict[str, Any] = field(default_factory=dict)
    task: Task | None = None
    pending: dict[Any, int] = field(default_factory=dict)
    results: dict[int, RankResult | Death | dict[str, Any]] = field(default_factory=dict)  # info while starting
    failed_at: float | None = None
    started: float = 0.0  # time.monotonic() when its current job was handed out

    def who(self, rank: int | None = None) -> str:
        info = self.info
        name = f"{info.get('host')}:{info.get('pid')}" if info else f"#{self.number}"
        if len(self.actors) > 1:
            return f"group {name}" if rank is None else f"rank {rank} of group {name}"
        return f"worker {name}"


@dataclass
class Death:
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


class Pool:
    """The workers: starting (waiting for every rank's `ready`/`setup`), idle, busy. Replacements
    are bounded so a model that kills every worker cannot loop forever."""

    def __init__(self, launcher: Any, size: int, max_attempts: int):
        """launcher: `SingleLauncher` or `group.GroupLauncher`."""
        self.launcher = launcher
        self.stuck_s = STUCK_S  # read when the pool starts: a test may shorten it
        self.size = size
        self.starts_left = size * (1 + max_attempts)
        self.starting: dict[Any, Worker] = {}  # a rank's ready()/setup() ref -> worker
        self.idle: list[Worker] = []
        self.busy: dict[Any, Worker] = {}  # a rank's run() ref -> worker (worker.task: its job)
        self.seen: list[dict[str, Any]] = []  # info of every worker that became ready
        self.load_errors: list[str] = []
        self.number = 0
        for _ in range(size):
            self.start()

    def workers(self) -> list[Worker]:
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
        worker = Worker(self.number, actors, group)
        for rank, ref in enumerate(refs):
            worker.pending[ref] = rank
            self.starting[ref] = worker
        return True

    def dispatch(self, worker: Worker, task: Task) -> None:
        self.idle.remove(worker)
        worker.task, worker.results, worker.failed_at, worker.started = task, {}, None, time.monotonic()
        for rank, ref in enumerate(self.launcher.run(worker.actors, task.job, task.attempt)):
            worker.pending[ref] = rank
            self.busy[ref] = worker

    def stop(self, worker: Worker) -> list[Any]:
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
        wait_gone(running, wait_s)

    def stuck(self, now: float) -> list[Worker]:
        """Busy groups where a rank failed alone more than `stuck_s` ago (its peers wait forever)."""
        return [w for w in self.busy_workers() if w.failed_at is not None and now - w.failed_at > self.stuck_s]

    def busy_workers(self) -> list[Worker]:
        """Workers with a job in flight, each once (a group has one ref per rank)."""
        return list(dict.fromkeys(self.busy.values()))

    def overdue(self, now: float, limit_s: float | None) -> list[Worker]:
        """Busy workers whose job was handed out more than limit_s ago (none without a limit)."""
        if limit_s is None:
            return []
        return [w for w in self.busy_workers() if now - w.started > limit_s]


def wait_gone(refs: list[Any], wait_s: float) -> None:
    """Each in-flight ref resolves (with ActorDiedError) once its process is gone."""
    import ray

    if not refs:
        return
    try:
        ray.wait(refs, num_returns=len(refs), timeout=wait_s)
    except Exception:
        log.debug("waiting for stopped workers failed", exc_info=True)
