"""The scheduler's edges, typed: what it is given (`SchedulingSpec`) and what it hands back.

`run_jobs(spec, todo, ...)` yields (plan index, `JobFinished` | `JobFailed`) per job: rank 0's
`RankResult` of a job a worker ran to the end (done, or the job's own failure), or why no worker
could finish it. It calls `on_pool(PoolSummary)` once, when its workers stop. The driver turns
outcomes into manifest records (`sagevideo.generation.run.outcome_record`); the scheduler
neither reads the driver's plan nor writes its report.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sagevideo.host.pipeline_host import RunContext
from sagevideo.host.result import RankResult
from sagevideo.outputs.manifest import Retry, WorkerInfo

__all__ = ["JobFailed", "JobFinished", "JobOutcome", "PoolSummary", "SchedulingSpec"]


@dataclass(frozen=True)
class SchedulingSpec:
    """How to run a batch's jobs on Ray.

    context: what each worker loads (the model, device, dtype, output folder, recipe). address:
    None = a local Ray instance, "auto", or HOST:PORT. workers: None = one per GPU (per node on CPU),
    else that many (groups, with ranks > 1). ranks: processes that share each job by sequence
    parallelism (1: plain workers). max_attempts: runs of a job whose worker died before it is
    failed. job_timeout: seconds a job may run after it was handed out (None: no limit)."""

    context: RunContext
    address: str | None = None
    workers: int | None = None
    ranks: int = 1
    max_attempts: int = 3
    job_timeout: float | None = None

    @property
    def device(self) -> str:
        return self.context.device

    @property
    def out(self) -> Path:
        return self.context.out


@dataclass(frozen=True)
class JobFinished:
    """A job its worker (every rank of its group) ran to the end: rank 0's result, whose record
    says done or the job's own failure; retries: the earlier attempts a worker's death ended."""

    result: RankResult
    retries: tuple[Retry, ...] = ()


@dataclass(frozen=True)
class JobFailed:
    """A job no worker could finish: why, the runs it took, one retry per worker death, and the
    last worker that had it (None when none did)."""

    error: str
    attempts: int
    retries: tuple[Retry, ...] = ()
    worker: WorkerInfo | None = None


JobOutcome = JobFinished | JobFailed


@dataclass(frozen=True)
class PoolSummary:
    """Where a batch ran: workers that became ready (groups, with ranks > 1), their nodes, the cluster."""

    workers: int
    nodes: int
    ranks: int
    cluster: str

    def describe(self) -> str:
        """E.g. '2 Ray worker(s) on 1 node(s) of a local Ray instance'."""
        kind = "Ray worker(s)" if self.ranks == 1 else f"Ray group(s) of {self.ranks} ranks"
        return f"{self.workers} {kind} on {self.nodes} node(s) of {self.cluster}"
