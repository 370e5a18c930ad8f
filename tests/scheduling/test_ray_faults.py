"""Ray when things go wrong: an address that is not a Ray head, a dead RAY_ADDRESS, a stale
`ray start` record, SIGTERM to a driver with Ray workers; and the CPU threads of shared workers."""

from __future__ import annotations

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

import sagevideo  # noqa: E402
from sagevideo.jobs.specs import InputError  # noqa: E402
from sagevideo.scheduling import cluster as cluster_module  # noqa: E402
from sagevideo.scheduling.cluster import Cluster, cpu_threads, head_problem, ray_session  # noqa: E402

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


@pytest.mark.slow
def test_sigterm_to_a_driver_with_ray_workers_stops_it_like_ctrl_c(tmp_path):
    """Before, Ray's C++ signal handler in the driver printed `*** SIGTERM received` and a stack
    dump and aborted (exit 134), with no summary."""
    out = tmp_path / "out"
    prompts = [arg for i in range(8) for arg in ("-p", f"shot {i}")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, "-m", "sagevideo", "generate", *prompts, "--out", str(out), "--workers", "2",
               "--steps", "1", "--attention", "full", "--no-progress"]
    run = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    manifest = out / "manifest.jsonl"
    deadline = time.monotonic() + 240
    while not (manifest.exists() and manifest.stat().st_size) and run.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)  # waiting on another process: the first job's line
    run.send_signal(signal.SIGTERM)
    stdout, stderr = run.communicate(timeout=120)
    assert run.returncode == 143, stderr
    assert "SIGTERM received" not in stderr and "Traceback" not in stderr
    records = [json.loads(line) for line in manifest.read_text().splitlines()]
    assert stdout.startswith(f"sagevideo: terminated (SIGTERM) after {len(records)} done, 0 skipped, 0 failed")
    assert "node(s) of a local Ray instance" in stdout and stdout.strip().endswith("re-run the same command to resume")
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
