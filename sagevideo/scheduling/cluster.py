"""Join or start Ray, and decide how many workers a batch gets.

- Ray already initialised in this process (a script or a test did `ray.init`): use it, leave it connected.
- address None or "local": start a private local instance without the dashboard's web UI (Ray
  still starts its per-node dashboard agent process), shut down afterwards.
- "auto": join the cluster this machine belongs to: RAY_ADDRESS when set (a head that does not
  answer there is an InputError: the user pointed at it), else the cluster last started with
  `ray start` on this machine (one that no longer answers is said loudly, then a local instance
  starts), else a local instance as above (said too).
- HOST:PORT (or ray://HOST:PORT): join that cluster; an unreachable one is an InputError.
Before `ray.init` joins anything, the address is probed (`head_problem`): a TCP connect and one
HTTP/2 exchange, which a Ray head (gRPC) answers at once. Ray itself retries a closed port or a
port that is not a Ray head for minutes; the probe says it within seconds.
A session this module opened is closed at the end (a joined cluster keeps running); a local
instance also ends when the driver is killed outright, through a watcher process (`reaper`). `ray.init`
replaces the process's SIGTERM handler (and Ray's core worker adds a C++ one that dumps a stack
trace and aborts); the handler the caller had is put back, so SIGTERM stops a batch like Ctrl-C.
Note: Ray rewrites 127.0.0.1/localhost in an address to this machine's outward IP before
connecting, so a cluster on one machine must listen on that IP (as `ray start` does by default).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import signal
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from sagevideo.errors import InputError, first_line

PROBE_TIMEOUT_S = 3.0  # a Ray head answers the probe in milliseconds, even across a data centre
# An HTTP/2 client's opening (RFC 9113 section 3.4) and an empty SETTINGS frame. A gRPC server,
# as Ray's GCS and Ray Client servers are, answers with a SETTINGS frame (type 4) of its own.
_HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
_HTTP2_SETTINGS = 4


@dataclass(frozen=True)
class Cluster:
    """What the batch runs on. started: a local instance this run started (and stops).
    node_resources: each alive node's resources ({"CPU": 8.0, "GPU": 2.0, ...}): a group of
    ranks must fit on one node. via: how it was found ("RAY_ADDRESS", "ray start", "--address";
    "" for a local instance or a session this process had already joined)."""

    address: str
    started: bool
    nodes: int
    cpus: float
    gpus: float
    node_resources: tuple[dict[str, float], ...] = field(default=(), compare=False)
    via: str = ""

    def describe(self) -> str:
        kind = "local Ray instance" if self.started else f"Ray cluster {self.address}"
        return f"{kind}: {self.nodes} node(s), {self.cpus:g} CPUs, {self.gpus:g} GPUs"

    def name(self) -> str:
        """Which cluster, for the summary line: 'a local Ray instance' or 'the Ray cluster at ADDR (RAY_ADDRESS)'."""
        if self.started:
            return "a local Ray instance"
        return f"the Ray cluster at {self.address}" + (f" ({self.via})" if self.via else "")


@contextlib.contextmanager
def ray_session(
    address: str | None, *, local_cpus: int | None = None, echo: Callable[[str], None] | None = None
) -> Iterator[Cluster]:
    """Connect for the duration of the block. local_cpus: CPUs a local instance advertises
    (None: Ray counts them); CPU workers each take one, so a CPU batch asks for as many as it has workers.
    echo: where notes for the user go (e.g. --address auto found no cluster)."""
    import ray

    echo = echo or (lambda line: None)
    from sagevideo.scheduling.quiet import quiet_ray_driver

    quiet_ray_driver()  # Ray's raylet lines and token notice stay off the terminal
    started = connected = False
    via = ""
    reaper = None  # for a local instance: stops what is left of it when this process ends
    if not ray.is_initialized():
        connected = True  # by this function: disconnect (or stop a local instance) at the end
        if address in (None, "local"):
            reaper = _start_local(local_cpus)
            started = True
        elif address == "auto":
            target, via = _auto_address()
            problem = head_problem(target) if target else None
            if target and problem and via == "RAY_ADDRESS":
                raise InputError(
                    f"--address auto: RAY_ADDRESS={target} names a Ray head that does not answer ({problem}); "
                    "start it (`ray start --head`), correct RAY_ADDRESS, or unset it to run on a local Ray instance"
                )
            if target and not problem:
                _join(target, address)
            else:
                if target:
                    echo(
                        f"sagevideo: --address auto: the cluster last started on this machine ({target}, by "
                        f"`ray start`) does not answer ({problem}); running on a local Ray instance instead"
                    )
                else:
                    echo(
                        "sagevideo: --address auto: no Ray cluster here (RAY_ADDRESS is unset and `ray start` "
                        "was not run on this machine); running on a local Ray instance"
                    )
                reaper = _start_local(local_cpus)
                started, via = True, ""
        else:
            problem = head_problem(address)
            if problem:
                raise InputError(
                    f"--address {address}: no Ray cluster answers there ({problem}); start one with "
                    "`ray start --head` on the head machine, or leave --address out for a local run"
                )
            _join(address, address)
            via = "--address"
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
            via=via,
        )
    finally:
        try:
            if connected:
                ray.shutdown()  # stops a local instance; only disconnects from a joined cluster
        finally:
            if reaper is not None:
                reaper.finish()


def head_problem(address: str, timeout_s: float | None = None) -> str | None:
    """Why no Ray head answers at HOST:PORT (ray://HOST:PORT too), or None when one does.

    Probes where Ray will connect (it rewrites 127.0.0.1 to this machine's IP): a TCP connect,
    then an HTTP/2 opening that a gRPC server answers with a SETTINGS frame. timeout_s: for the
    connect and for the answer each (default PROBE_TIMEOUT_S)."""
    timeout_s = PROBE_TIMEOUT_S if timeout_s is None else timeout_s
    client = address.startswith("ray://")
    host, _, port = address.removeprefix("ray://").rpartition(":")
    host = host.strip("[]")
    if not client:
        host = _ray_host(host)
    try:
        sock = socket.create_connection((host, int(port)), timeout=timeout_s)
    except TimeoutError:
        return f"no answer to a connection in {timeout_s:g} s"
    except (OSError, ValueError) as err:
        return getattr(err, "strerror", None) or str(err) or type(err).__name__
    try:
        with sock:
            sock.sendall(_HTTP2_PREFACE)
            reply = _read(sock, 9)
    except TimeoutError:
        return f"something listens there but gave no reply in {timeout_s:g} s; it is not a Ray head"
    except OSError:
        reply = b""  # reset by the peer: not a gRPC server either
    if len(reply) < 9 or reply[3] != _HTTP2_SETTINGS:
        return "something listens there, but it is not a Ray head (it does not answer gRPC)"
    return None


def cpu_threads(cluster: Cluster, actors: int) -> int | None:
    """Torch intra-op threads for each of `actors` CPU worker processes, so that together they use
    each node's CPUs once: Ray sets OMP_NUM_THREADS=1 in every worker (one reserved CPU each),
    which leaves most of a big node idle, while torch's own default (all cores in every process)
    slows several workers on one node down many times over. None when OMP_NUM_THREADS is set here:
    the user chose."""
    if os.environ.get("OMP_NUM_THREADS"):
        return None
    if cluster.started:
        cpus = _usable_cpus()  # a local instance may advertise more CPUs than it has (one per worker)
    else:
        cpus = int(min((r.get("CPU", 1.0) for r in cluster.node_resources), default=1.0))
    per_node = math.ceil(actors / max(1, cluster.nodes))  # SPREAD: workers go to every node in turn
    return max(1, cpus // max(1, per_node))


def _usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _read(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            break
        data += chunk
    return data


def _ray_host(host: str) -> str:
    """The host Ray connects to for `host` (loopback becomes this machine's IP), else `host`."""
    try:
        from ray._private.services import resolve_ip_for_localhost  # no public equivalent

        return resolve_ip_for_localhost(host)
    except Exception:
        return host


def _join(target: str, given: str) -> None:
    """ray.init on a cluster that answered the probe; a failure is an InputError."""
    import ray

    try:
        with _keep_sigterm_handler():
            ray.init(address=target, logging_level=logging.WARNING)
    except ConnectionError as err:
        raise InputError(f"--address {given}: could not join the Ray cluster ({first_line(err)})") from None


@contextlib.contextmanager
def _keep_sigterm_handler() -> Iterator[None]:
    """Put back the SIGTERM handler `ray.init` replaces: Ray's Python one exits, and the C++ one
    its core worker installs dumps a stack trace and aborts (exit 134). The caller's handler (the
    batch driver's: stop like Ctrl-C) is the one that keeps the summary and the resume hint."""
    main = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGTERM) if main else None
    try:
        yield
    except SystemExit as stop:
        # A SIGTERM while Ray starts reached Ray's handler (sys.exit(15)): give it to the caller's.
        if stop.code == signal.SIGTERM and callable(previous):
            previous(signal.SIGTERM, None)
        raise
    finally:
        if previous is not None:  # None: set outside Python, nothing to put back
            signal.signal(signal.SIGTERM, previous)


# At shutdown Ray's core worker flushes its task events (what `ray list tasks` and the dashboard
# show) to the GCS, waiting up to 5 s for it. A private instance's GCS stops right after, and after
# a closed terminal's SIGHUP (sent to the whole process group) it is already gone: the driver then
# waited the whole 5 s before its summary and exit 129 (shutdown with the GCS killed: 6.1 s, 1.2 s
# with this bound; a normal end's 1.1 s unchanged).
TASK_EVENT_FLUSH_ENV = "RAY_task_events_shutdown_flush_timeout_ms"
TASK_EVENT_FLUSH_MS = "100"


@contextlib.contextmanager
def _short_task_event_flush() -> Iterator[None]:
    """Bound the shutdown flush of task events for the instance `ray.init` starts inside (Ray reads
    the setting when its core worker starts; the raylet and its workers inherit it); a value the user
    set is kept, and the environment is as before afterwards."""
    if TASK_EVENT_FLUSH_ENV in os.environ:
        yield
        return
    os.environ[TASK_EVENT_FLUSH_ENV] = TASK_EVENT_FLUSH_MS
    try:
        yield
    finally:
        os.environ.pop(TASK_EVENT_FLUSH_ENV, None)


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


def _start_local(cpus: int | None) -> Any:
    """Start a private local instance; returns its `reaper.Reaper` (None where none could start:
    the instance still runs, and ends with `ray.shutdown()` as before)."""
    import psutil
    import ray

    from sagevideo.scheduling import reaper

    if cpus is not None:
        cpus = max(cpus, os.cpu_count() or 1)
    before = {child.pid for child in psutil.Process().children()}
    # No dashboard head (its web UI); Ray still starts each node's dashboard agent, which include_dashboard
    # does not turn off. A private instance for this batch only.
    with _keep_sigterm_handler(), _short_task_event_flush():
        ray.init(address="local", num_cpus=cpus, include_dashboard=False, logging_level=logging.WARNING)
    roots = [child for child in psutil.Process().children() if child.pid not in before]  # what ray.init started
    try:
        return reaper.start(roots)
    except OSError:  # no process to spare: a killed driver's agents then linger a minute, as Ray has them
        logging.getLogger("sagevideo").debug("could not start the Ray watcher", exc_info=True)
        return None


def _auto_address() -> tuple[str | None, str]:
    """(address, where it came from): RAY_ADDRESS, else the cluster last started with `ray start`
    on this machine ("ray start"), else (None, "").

    Unlike Ray's own "auto", any other Ray process found running on the machine (someone else's
    local instance) is not joined."""
    if os.environ.get("RAY_ADDRESS"):
        return os.environ["RAY_ADDRESS"], "RAY_ADDRESS"
    try:
        from ray._private.services import find_bootstrap_address  # no public equivalent

        found = find_bootstrap_address(None)
    except Exception:  # a Ray without it, or no cluster recorded
        found = None
    return (found, "ray start") if found else (None, "")
