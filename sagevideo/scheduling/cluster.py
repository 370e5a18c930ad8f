"""Join or start Ray, and decide how many workers a batch gets.

- Ray already initialised in this process (a script or a test did `ray.init`): use it, leave it connected.
- address None or "local": start a private local instance, dashboard off, shut down afterwards.
- "auto": join the cluster this machine belongs to (RAY_ADDRESS or a `ray start` on this
  machine); when there is none, start a local instance as above.
- HOST:PORT (or ray://HOST:PORT): join that cluster; an unreachable one is an InputError.
A session this module opened is closed at the end (a joined cluster keeps running).
Note: Ray rewrites 127.0.0.1/localhost in an address to this machine's outward IP before
connecting, so a cluster on one machine must listen on that IP (as `ray start` does by default).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from collections.abc import Iterator
from dataclasses import dataclass, field

from sagevideo.jobs import InputError


@dataclass(frozen=True)
class Cluster:
    """What the batch runs on. started: a local instance this run started (and stops).
    node_resources: each alive node's resources ({"CPU": 8.0, "GPU": 2.0, ...}): a group of
    ranks must fit on one node."""

    address: str
    started: bool
    nodes: int
    cpus: float
    gpus: float
    node_resources: tuple[dict[str, float], ...] = field(default=(), compare=False)

    def describe(self) -> str:
        kind = "local Ray instance" if self.started else f"Ray cluster {self.address}"
        return f"{kind}: {self.nodes} node(s), {self.cpus:g} CPUs, {self.gpus:g} GPUs"


@contextlib.contextmanager
def ray_session(address: str | None, *, local_cpus: int | None = None) -> Iterator[Cluster]:
    """Connect for the duration of the block. local_cpus: CPUs a local instance advertises
    (None: Ray counts them); CPU workers each take one, so a CPU batch asks for as many as it has workers."""
    import ray

    from sagevideo.scheduling.quiet import quiet_ray_driver

    quiet_ray_driver()  # Ray's raylet lines and token notice stay off the terminal
    started = connected = False
    if not ray.is_initialized():
        connected = True  # by this function: disconnect (or stop a local instance) at the end
        if address in (None, "local"):
            _start_local(local_cpus)
            started = True
        else:
            target = _auto_address() if address == "auto" else address
            if address == "auto" and (target is None or _unreachable(target)):
                _start_local(local_cpus)  # auto with no cluster around: this machine alone
                started = True
            else:
                # Ray itself retries an unreachable head for minutes; a plain connect says it in seconds.
                problem = _unreachable(target)
                if problem:
                    raise InputError(
                        f"--address {address}: no Ray cluster answers there ({problem}); start one with "
                        "`ray start --head` on the head machine, or leave --address out for a local run"
                    )
                try:
                    ray.init(address=target, logging_level=logging.WARNING)
                except ConnectionError as err:
                    raise InputError(
                        f"--address {address}: could not join the Ray cluster ({_first_line(err)})"
                    ) from None
    try:
        resources = ray.cluster_resources()
        alive = [node for node in ray.nodes() if node.get("Alive")]
        yield Cluster(
            address=ray.get_runtime_context().gcs_address,
            started=started,
            nodes=len(alive),
            cpus=resources.get("CPU", 0.0),
            gpus=resources.get("GPU", 0.0),
            node_resources=tuple(dict(node.get("Resources") or {}) for node in alive),
        )
    finally:
        if connected:
            ray.shutdown()  # stops a local instance; only disconnects from a joined cluster


def pool_size(requested: int | None, device: str, cluster: Cluster, jobs: int) -> tuple[int, list[str]]:
    """(workers to start, notes). One worker per GPU on CUDA, one per node on CPU, unless asked
    otherwise; never more than the cluster can place (each takes 1 GPU, or 1 CPU) nor than jobs."""
    if device == "cuda":
        capacity, unit = int(cluster.gpus), "GPU"
        default = capacity
    else:
        capacity, unit = int(cluster.cpus), "CPU"
        default = cluster.nodes
    if capacity < 1:
        raise InputError(
            f"the {cluster.describe()} has no {unit} for a worker; "
            + ("run with --device cpu or on a cluster with GPUs" if unit == "GPU" else "add a node with CPUs")
        )
    notes = []
    size = requested or default
    if size > capacity:
        notes.append(f"--workers {size}: the {cluster.describe()} has room for {capacity}; starting {capacity}")
        size = capacity
    return max(1, min(size, jobs)), notes


def group_pool_size(
    requested: int | None, device: str, cluster: Cluster, ranks: int, jobs: int
) -> tuple[int, list[str]]:
    """(groups to start, notes) for jobs of `ranks` ranks each (one GPU each on CUDA, one CPU on
    CPU). A group's ranks share one node (STRICT_PACK), so what counts is how many groups each
    node holds. Default: as many as the GPUs hold; on CPU one per node that holds one."""
    unit = "GPU" if device == "cuda" else "CPU"
    per_node = [int(resources.get(unit, 0.0)) // ranks for resources in cluster.node_resources]
    capacity = sum(per_node)
    if capacity < 1:
        largest = max((int(r.get(unit, 0.0)) for r in cluster.node_resources), default=0)
        raise InputError(
            f"--gpus-per-job {ranks}: no node of the {cluster.describe()} has {ranks} {unit}s for one group "
            f"(a job's ranks share one node; the largest node has {largest}); lower --gpus-per-job"
            + (" or run with --device cpu" if unit == "GPU" and not cluster.gpus else "")
        )
    default = capacity if unit == "GPU" else sum(1 for n in per_node if n)
    notes = []
    size = requested or default
    if size > capacity:
        notes.append(
            f"--workers {size}: the {cluster.describe()} has room for {capacity} group(s) of {ranks}; "
            f"starting {capacity}"
        )
        size = capacity
    return max(1, min(size, jobs)), notes


def _start_local(cpus: int | None) -> None:
    import ray

    if cpus is not None:
        cpus = max(cpus, os.cpu_count() or 1)
    # No dashboard (nothing listens for HTTP); a private instance for this batch only.
    ray.init(address="local", num_cpus=cpus, include_dashboard=False, logging_level=logging.WARNING)


def _auto_address() -> str | None:
    """RAY_ADDRESS, else the cluster last started with `ray start` on this machine, or None.

    Unlike Ray's own "auto", any other Ray process found running on the machine (someone else's
    local instance) is not joined."""
    if os.environ.get("RAY_ADDRESS"):
        return os.environ["RAY_ADDRESS"]
    try:
        from ray._private.services import get_ray_address_from_environment  # no public equivalent

        return get_ray_address_from_environment(None, None)
    except Exception:  # a Ray without it, or no cluster recorded
        return None


def _unreachable(address: str, timeout_s: float = 5.0) -> str | None:
    """Why nothing accepts TCP connections at HOST:PORT (ray:// too), or None."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            return None
    except (OSError, ValueError) as err:
        return getattr(err, "strerror", None) or str(err) or type(err).__name__


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__
