"""Joining or starting a Ray cluster (`scheduling/cluster.py`) and when that goes wrong: an address
that is not a Ray head, a dead RAY_ADDRESS, a stale `ray start` record, SIGTERM to a driver with Ray
workers, the local instance gone however its driver ends (kill -9, SIGHUP, a normal end); the CPU
threads of shared workers, group pool sizes; a two-node cluster on this machine
(ray.cluster_utils.Cluster) joined through `address`."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

# These tests start, join or refuse Ray themselves, and check that nothing is left connected.
pytestmark = pytest.mark.usefixtures("no_ray")

import sagevideo  # noqa: E402
from sagevideo.errors import InputError  # noqa: E402
from sagevideo.scheduling import cluster as cluster_module  # noqa: E402
from sagevideo.scheduling.cluster import (  # noqa: E402
    Cluster,
    cpu_threads,
    group_pool_size,
    head_problem,
    ray_session,
)

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def listener():
    """A plain TCP server on a free port of every local address (Ray rewrites 127.0.0.1 to this
    machine's IP): it accepts connections and answers each with `reply` (None: never answers)."""
    servers = []

    def start(reply: bytes | None = None) -> int:
        server = socket.create_server(("", 0))
        servers.append(server)

        def serve():
            held = []
            while True:
                try:
                    conn, _ = server.accept()
                except OSError:  # closed at teardown
                    return
                held.append(conn)
                if reply is not None:
                    conn.sendall(reply)

        threading.Thread(target=serve, daemon=True).start()
        return server.getsockname()[1]

    yield start
    for server in servers:
        server.close()


@pytest.fixture
def no_model_load(monkeypatch):
    import sagevideo.pipelines.loading as loading

    monkeypatch.setattr(loading, "load_pipeline", lambda *a, **k: pytest.fail("a model was loaded"))


def test_open_port_that_is_not_a_ray_head_fails_within_seconds(tmp_path, listener, monkeypatch, no_model_load):
    """Before, Ray retried it for minutes, printing gcs_client TimedOut lines."""
    monkeypatch.setattr(cluster_module, "PROBE_TIMEOUT_S", 0.5)
    port = listener(reply=None)
    start = time.monotonic()
    with pytest.raises(InputError) as err:
        sagevideo.generate(["a cat"], out=tmp_path / "out", address=f"127.0.0.1:{port}", progress=False)
    assert time.monotonic() - start < 10  # the probe's 0.5 s plus plan checks
    assert str(err.value) == (
        f"--address 127.0.0.1:{port}: no Ray cluster answers there (something listens there but gave no reply "
        "in 0.5 s; it is not a Ray head); start one with `ray start --head` on the head machine, or leave "
        "--address out for a local run"
    )
    assert not ray.is_initialized()


def test_a_server_that_answers_but_not_grpc_is_not_a_ray_head(listener):
    port = listener(reply=b"HTTP/1.1 400 Bad Request\r\n\r\n")
    not_grpc = "something listens there, but it is not a Ray head (it does not answer gRPC)"
    assert head_problem(f"127.0.0.1:{port}") == not_grpc


def test_dead_ray_address_with_auto_is_an_error_not_a_silent_local_run(tmp_path, monkeypatch, no_model_load):
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:9")  # nothing listens on port 9 (discard)
    with pytest.raises(InputError, match=r"--address auto: RAY_ADDRESS=127\.0\.0\.1:9 names a Ray head that does "
                       r"not answer \(.+\); start it .* or unset it to run on a local Ray instance"):
        sagevideo.generate(["a cat"], out=tmp_path / "out", address="auto", progress=False)
    assert not ray.is_initialized()


@pytest.mark.slow
def test_stale_ray_start_record_falls_back_to_a_local_instance_loudly(monkeypatch):
    """`--address auto` finds the cluster `ray start` last recorded on this machine, but it is
    gone: the run says so and uses a local instance (whose head the probe recognises)."""
    from ray._private import services

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(services, "find_bootstrap_address", lambda temp_dir: "127.0.0.1:9")
    lines = []
    with ray_session("auto", local_cpus=1, echo=lines.append) as cluster:
        assert cluster.started and cluster.name() == "a local Ray instance"
        assert head_problem(cluster.address) is None  # a real Ray head answers the probe
    assert len(lines) == 1 and lines[0].startswith(
        "sagevideo: --address auto: the cluster last started on this machine (127.0.0.1:9, by `ray start`) "
        "does not answer ("
    )
    assert lines[0].endswith("); running on a local Ray instance instead")
    assert not ray.is_initialized()


@pytest.fixture
def own_ray_tmpdir():
    """A Ray temp folder of the test's own (short: Ray puts unix sockets there), so that `--address
    auto` finds no cluster another test started and falls back to a local instance."""
    import shutil
    import tempfile

    path = tempfile.mkdtemp(prefix="svr-")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _local_ray_driver(out: Path, ray_tmpdir: str) -> tuple[list[str], dict[str, str]]:
    """(command, environment) of a `sagevideo generate` driver of 8 one-step jobs on a local Ray
    instance of its own (`--address auto` with no cluster recorded) with one worker: the instance,
    not the worker count, is what these tests follow."""
    env = {key: value for key, value in os.environ.items() if key != "RAY_ADDRESS"}
    env.update(PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]), HF_HUB_OFFLINE="1",
               RAY_TMPDIR=ray_tmpdir)
    prompts = [arg for i in range(8) for arg in ("-p", f"shot {i}")]
    command = [sys.executable, "-m", "sagevideo", "generate", *prompts, "--out", str(out), "--address", "auto",
               "--workers", "1", "--steps", "1", "--attention", "full", "--no-progress"]
    return command, env


GONE_S = 10.0  # Ray's agents alone outlived a killed driver by 35-80 s


def _watch(run: subprocess.Popen, seen: dict, until) -> None:
    """Collect the driver's descendants (its Ray instance, the watcher, their children), each with
    its latest name, until `until()`."""
    import psutil

    deadline = time.monotonic() + 240
    while not until() and run.poll() is None and time.monotonic() < deadline:
        with contextlib.suppress(psutil.Error):
            for child in psutil.Process(run.pid).children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    seen[child] = child.name()  # (a Ray process renames itself as it starts)
        time.sleep(0.1)


def _left_running(seen: dict, within_s: float) -> list[str]:
    """Names of the processes of `seen` still running (zombies count as gone) after up to within_s seconds."""
    import psutil

    deadline = time.monotonic() + within_s
    while True:
        alive = []
        for process, name in seen.items():
            with contextlib.suppress(psutil.Error):
                if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                    alive.append(name)
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.2)


@pytest.mark.slow
def test_the_local_ray_instance_ends_with_its_driver_however_it_ends(tmp_path, own_ray_tmpdir, stop_signals_delivered):
    """Three runs of one batch on a local Ray instance (`_local_ray_driver`), each resuming the last. kill -9
    of the first driver mid-batch: within seconds no process of its instance runs (before, Ray's
    DashboardAgent and RuntimeEnvAgent stayed 35-80 s), and its `.sagevideo-run-*` marker stays
    (nothing in it could run). SIGHUP to the second's process group, as a closed terminal sends it:
    the summary, exit 129, its instance gone, and no marker left, its own nor the killed run's.
    SIGTERM to the third driver alone, as SLURM and Kubernetes send it, stops it like Ctrl-C (before,
    Ray's C++ signal handler printed `*** SIGTERM received`, a stack dump, and aborted with exit 134, no
    summary): the summary with the resume hint, exit 143, nothing of its instance left running (the
    way a batch that ends normally leaves it too: the same `ray_session` exit)."""
    out = tmp_path / "out"
    manifest = out / "manifest.jsonl"
    lines = lambda: len(manifest.read_text().splitlines()) if manifest.exists() else 0
    command, env = _local_ray_driver(out, own_ray_tmpdir)
    start = lambda: subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                                     start_new_session=True)  # its own process group, as a terminal's job

    killed, seen = start(), {}
    _watch(killed, seen, until=lambda: lines() >= 1)
    assert "raylet" in seen.values()
    killed.kill()
    killed.communicate(timeout=60)
    assert _left_running(seen, GONE_S) == []
    assert len(list(out.glob(".sagevideo-run-*"))) == 1

    hung_up, seen, before = start(), {}, lines()
    _watch(hung_up, seen, until=lambda: lines() > before)
    os.killpg(hung_up.pid, signal.SIGHUP)
    stdout, stderr = hung_up.communicate(timeout=120)
    assert hung_up.returncode == 129, stderr
    assert stdout.startswith("sagevideo: terminated (SIGHUP) after ") and "Traceback" not in stderr
    assert _left_running(seen, GONE_S) == []
    assert not list(out.glob(".sagevideo-run-*"))

    terminated, seen, before = start(), {}, lines()
    _watch(terminated, seen, until=lambda: lines() > before)
    terminated.send_signal(signal.SIGTERM)
    stdout, stderr = terminated.communicate(timeout=120)
    assert terminated.returncode == 143, stderr
    assert "SIGTERM received" not in stderr and "Traceback" not in stderr
    assert _left_running(seen, GONE_S) == []
    records = [json.loads(line) for line in manifest.read_text().splitlines()]
    assert stdout.startswith(f"sagevideo: terminated (SIGTERM) after {len(records) - before} done, {before} skipped,"
                             " 0 failed")
    assert "node(s) of a local Ray instance" in stdout and stdout.strip().endswith("re-run the same command to resume")
    assert {r["status"] for r in records} == {"done"} and len({r["job_id"] for r in records}) == len(records)
    assert sorted(os.listdir(out)) == sorted(["manifest.jsonl", *(r["outputs"][0] for r in records)])


def test_cpu_threads_split_each_node_between_its_workers(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(cluster_module, "_usable_cpus", lambda: 16)
    local = Cluster("a:1", True, 1, 16.0, 0.0, ({"CPU": 16.0},))
    assert [cpu_threads(local, n) for n in (1, 2, 3, 16, 32)] == [16, 8, 5, 1, 1]
    two_nodes = Cluster("a:1", False, 2, 24.0, 0.0, ({"CPU": 8.0}, {"CPU": 16.0}))
    assert cpu_threads(two_nodes, 2) == 8 and cpu_threads(two_nodes, 4) == 4  # spread: the smaller node counts
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert cpu_threads(local, 2) is None  # the user chose; Ray passes it on to the workers


def test_sigterm_while_ray_starts_reaches_the_callers_handler(monkeypatch):
    """ray.init installs a SIGTERM handler that calls sys.exit(15); one that fires while Ray starts
    becomes the caller's (the batch driver's: stop like Ctrl-C), and the caller's handler is back."""

    class Stop(Exception):
        pass

    def callers(signum, frame):
        raise Stop()

    def init(*args, **kwargs):  # what ray.init does, then a SIGTERM arriving before it returns
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(signum))
        sys.exit(signal.SIGTERM)

    previous = signal.signal(signal.SIGTERM, callers)
    try:
        monkeypatch.setattr(ray, "init", init)
        with pytest.raises(Stop), ray_session(None):
            pass
        assert signal.getsignal(signal.SIGTERM) is callers
    finally:
        signal.signal(signal.SIGTERM, previous)


@pytest.mark.parametrize("users", [None, "2500"])
def test_a_private_instance_starts_with_a_short_task_event_flush_and_leaves_the_environment_as_it_was(
        monkeypatch, users):
    """Ray reads the flush bound when ray.init starts its core worker: set then (a user's value kept),
    gone afterwards, so that a driver whose GCS a closed terminal ended exits without waiting 5 s."""
    env = cluster_module.TASK_EVENT_FLUSH_ENV
    if users is None:
        monkeypatch.delenv(env, raising=False)
    else:
        monkeypatch.setenv(env, users)
    seen = []
    monkeypatch.setattr(ray, "init", lambda *args, **kwargs: seen.append(os.environ.get(env)))
    monkeypatch.setattr("sagevideo.scheduling.reaper.start", lambda roots: None)
    cluster_module._start_local(None)
    assert seen == [users or cluster_module.TASK_EVENT_FLUSH_MS]
    assert os.environ.get(env) == users


# ------------------------------------------------------------------------------------------------
# A two-node Ray cluster on this machine (ray.cluster_utils.Cluster), joined through `address`.


OBJECT_STORE_BYTES = 80 * 2**20  # as in conftest: jobs return file names, not frames


@pytest.fixture
def two_nodes():
    """A head and a worker node of one CPU each: one sagevideo worker fits on each."""
    from ray.cluster_utils import Cluster

    assert not ray.is_initialized()
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "include_dashboard": False, "object_store_memory": OBJECT_STORE_BYTES},
    )
    cluster.add_node(num_cpus=1, object_store_memory=OBJECT_STORE_BYTES)
    cluster.wait_for_nodes()
    yield cluster
    if ray.is_initialized():
        ray.shutdown()
    cluster.shutdown()


@pytest.mark.slow
def test_batch_runs_across_both_nodes_through_address(tmp_path, two_nodes):
    out = tmp_path / "out"
    # Jobs long enough (6 x ~1.5 s) that the first worker cannot drain the queue while the second
    # is still importing diffusers (~5-8 s): both nodes must get work.
    records = sagevideo.generate(
        [f"shot {i}" for i in range(6)], out=out, address=two_nodes.address, device="cpu", steps=8,
        frames=17, progress=False,
    )
    assert [r["status"] for r in records] == ["done"] * 6
    assert len({r["worker"]["node"] for r in records}) == 2  # default on CPU: one worker per node
    assert not ray.is_initialized()  # the run disconnected from the cluster it joined
    assert sorted(p.name for p in out.iterdir()) == sorted(["manifest.jsonl", *(r["outputs"][0] for r in records)])


def test_unreachable_address_is_a_clear_error_before_anything_loads(tmp_path, monkeypatch):
    import sagevideo.pipelines.loading as loading

    monkeypatch.setattr(loading, "load_pipeline", lambda *a, **k: pytest.fail("model loaded"))
    with pytest.raises(InputError, match=r"--address 127\.0\.0\.1:9: no Ray cluster answers there \(.*\); start one"):
        sagevideo.generate(["a cat"], out=tmp_path / "out", address="127.0.0.1:9", progress=False)
    assert not ray.is_initialized()


def test_groups_fit_on_one_node_each():
    two_small = Cluster("a:1", False, 2, 4.0, 2.0, ({"CPU": 2.0, "GPU": 1.0}, {"CPU": 2.0, "GPU": 1.0}))
    with pytest.raises(InputError, match=r"--gpus-per-job 2: no node .* has 2 GPUs for one group .*largest node has 1"):
        group_pool_size(None, "cuda", two_small, 2, jobs=5)
    big = Cluster("a:1", False, 2, 64.0, 12.0, ({"CPU": 32.0, "GPU": 8.0}, {"CPU": 32.0, "GPU": 4.0}))
    assert group_pool_size(None, "cuda", big, 4, jobs=10) == (3, [])  # 2 groups + 1 group
    size, notes = group_pool_size(5, "cuda", big, 4, jobs=10)
    assert size == 3 and "room for 3 group(s) of 4" in notes[0]
    assert group_pool_size(None, "cpu", big, 4, jobs=10)[0] == 2  # CPU: one group per node
