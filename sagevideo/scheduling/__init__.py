"""Ray scheduling: the only place sagevideo imports Ray (and only inside functions).

A batch runs on a pool of Ray actors, each holding one loaded pipeline, fed from one job queue:
- `cluster`: join a running cluster (`--address auto|HOST:PORT`) or start a private local
  instance (no dashboard web UI), and size the worker pool from the cluster's GPUs/CPUs;
- `reaper`: a watcher process that stops what is left of a local instance when its driver ends,
  kill -9 included;
- `worker`: the actor: loads the pipeline once in `__init__`, then runs one job per call and
  returns its `RankResult` (a manifest record and a staged file name), never video tensors;
- `group`: for `--gpus-per-job N`, a worker made of N rank actors in one STRICT_PACK placement
  group that set torchrun-style variables and split each job by sequence parallelism;
- `queue`: hands jobs to idle workers, retries a job whose worker died on another worker (up to
  `max_attempts`), replaces dead workers (a whole group when one rank dies), and stops every
  worker on Ctrl-C;
- `spec`: its typed edges: a `SchedulingSpec` in, `JobFinished` / `JobFailed` outcomes out;
- `executor`: whether a batch runs here or on Ray (`choose_executor`).
The driver (`sagevideo.generation.run.run_batch`) makes the records of the outcomes, renames
outputs into place and writes the manifest; workers never touch it.
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sagevideo.scheduling.spec import JobOutcome, SchedulingSpec

_HOST_PORT = re.compile(r"(ray://)?[A-Za-z0-9.\-]+:\d{1,5}|(ray://)?\[[0-9A-Fa-f:.]+\]:\d{1,5}")


def ray_installed() -> bool:
    """True when `import ray` would work (checked without importing it)."""
    return importlib.util.find_spec("ray") is not None


def address_problem(address: str) -> str | None:
    """Why `address` is not a Ray address ("auto", "local", HOST:PORT, ray://HOST:PORT), or None."""
    if address in ("auto", "local") or _HOST_PORT.fullmatch(address):
        return None
    return (
        f"--address {address}: not a Ray address; give auto (the cluster this machine belongs to) "
        "or the head's HOST:PORT, e.g. 10.0.0.5:6379"
    )


def run_jobs(spec: SchedulingSpec, todo: list, **kwargs: Any) -> Iterator[tuple[int, JobOutcome]]:
    """Run `todo` [(plan index, PlannedJob)] on Ray workers; see `sagevideo.scheduling.queue.run_jobs`."""
    from sagevideo.scheduling.queue import run_jobs as run

    return run(spec, todo, **kwargs)
