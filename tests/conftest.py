"""Shared test set-up: nothing may be downloaded or reach the network.

Hub, torch and sagevideo caches point at empty temporary folders (set before any test imports diffusers,
whose hub constants are read at import), HF_HUB_OFFLINE=1 makes hub lookups fail at once, and
an autouse fixture refuses socket connections to anything but loopback.

Fixtures several folders share live here: the tiny CogVideoX pipeline, `two_ranks` (the gloo
tests' two processes), `ray_local` and `no_ray` (one Ray instance per pytest process),
`no_model_load`, and the evaluation fixtures (synthetic arms, tiny local
metric models; helpers in tests/helpers/evalkit.py) that tests/eval, tests/experiments and
tests/cli use. Folder conftests add what only their folder
needs (Ray in tests/scheduling, the Open-Sora checkpoint in tests/pipelines/opensora).
"""

from __future__ import annotations

import os
import socket
import tempfile
from pathlib import Path

import pytest

_CACHE = tempfile.mkdtemp(prefix="sagevideo-tests-cache-")
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_HOME"] = os.path.join(_CACHE, "hf")
os.environ["TORCH_HOME"] = os.path.join(_CACHE, "torch")
os.environ["SAGEVIDEO_CACHE"] = os.path.join(_CACHE, "sagevideo")  # model fingerprints' file digests
os.environ["TRANSFORMERS_OFFLINE"] = "1"

_LOOPBACK = {"127.0.0.1", "::1", "localhost"}


@pytest.fixture
def allowed_hosts() -> set[str]:
    """Hosts tests may connect to; a folder's conftest may widen it (e.g. this machine's own IPs)."""
    return set(_LOOPBACK)


@pytest.fixture(autouse=True)
def no_network(monkeypatch, allowed_hosts):
    """Any inet connection to a host outside `allowed_hosts` raises (unix sockets are fine)."""
    real_connect, real_connect_ex = socket.socket.connect, socket.socket.connect_ex

    def check(sock: socket.socket, address) -> None:
        if sock.family in (socket.AF_INET, socket.AF_INET6) and address[0] not in allowed_hosts:
            raise OSError(f"tests must not reach the network (tried to connect to {address!r})")

    def connect(self, address):
        check(self, address)
        return real_connect(self, address)

    def connect_ex(self, address):
        check(self, address)
        return real_connect_ex(self, address)

    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket.socket, "connect_ex", connect_ex)


@pytest.fixture(scope="session")
def tiny_pipe():
    """The tiny CogVideoX pipeline, built once. Tests that change it must undo their changes."""
    from sagevideo.pipelines.cogvideox.tiny import tiny_pipeline

    pipe = tiny_pipeline()
    pipe.set_progress_bar_config(disable=True)
    return pipe


@pytest.fixture(scope="session")
def two_ranks():
    """run(fn, *args): fn(rank, 2, port, *args) on two gloo-capable CPU processes that this pytest
    process starts once and reuses (tests/helpers/two_ranks.py says why and what fn must do)."""
    from tests.helpers.two_ranks import TwoRanks

    ranks = TwoRanks()
    yield ranks.run
    ranks.close()


@pytest.fixture(scope="session")
def shared_ray():
    """This pytest process's local Ray instance (tests/helpers/ray_local.py), started on first use
    by `ray_local`, stopped by `no_ray` and at the session's end."""
    from tests.helpers.ray_local import SharedRay

    shared = SharedRay()
    yield shared
    shared.stop()


@pytest.fixture
def ray_local(shared_ray, allowed_hosts):
    """`ray` with a local instance (2 CPUs) running, shared with the other Ray tests of this
    pytest process (sagevideo uses it as it finds it); its nodes' addresses are let through the
    network guard."""
    from tests.helpers.ray_local import own_addresses

    allowed_hosts.update(own_addresses())
    return shared_ray.start()


@pytest.fixture
def no_ray(shared_ray):
    """No Ray instance in this process for the test (one that `ray_local` started is stopped)."""
    shared_ray.stop()


@pytest.fixture
def stop_signals_delivered():
    """SIGINT, SIGTERM and SIGHUP as an interactive session has them (Python's SIGINT handler, the
    others' defaults, none blocked), for the tests that signal their own process or a child they
    start. A suite started in the background by a shell inherits SIGINT ignored (POSIX shells ignore
    it for asynchronous jobs), one started under `nohup` SIGHUP ignored, and Python and its children
    keep an inherited SIG_IGN: the signal would never arrive (sagevideo leaves an ignored signal
    ignored, as `nohup` asks). Put back afterwards; yields the state found, for failure messages."""
    import signal

    stops = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    handlers = {signum: signal.getsignal(signum) for signum in stops}
    blocked = signal.pthread_sigmask(signal.SIG_UNBLOCK, stops)
    for signum in stops:
        signal.signal(signum, signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL)
    found = ", ".join(f"{signal.Signals(s).name} handler {h!r} blocked {s in blocked}" for s, h in handlers.items())
    yield found
    for signum, handler in handlers.items():
        signal.signal(signum, handler)
    signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


@pytest.fixture
def no_model_load(monkeypatch):
    """Fail the test if anything tries to load a model (checks that must come before loading)."""
    import sagevideo.pipelines.loading as loading

    monkeypatch.setattr(loading, "load_pipeline", lambda *a, **k: pytest.fail("a model was loaded"))


# ---- evaluation: synthetic arms, tiny local metric models (nothing downloaded) ------------------


@pytest.fixture()
def one_thread():
    """Used by the evaluation test modules (pytestmark), not by the other tests of their folders."""
    from tests.helpers.evalkit import single_thread

    with single_thread():
        yield


@pytest.fixture(scope="session")
def arms(tmp_path_factory) -> dict[str, Path]:
    """ref, an identical copy, and noisy test arms at increasing noise levels (sigma 3, 10, 30)."""
    from tests.helpers.evalkit import arm_videos, make_arm

    root = tmp_path_factory.mktemp("arms")
    out = {"ref": make_arm(root / "ref", arm_videos())}
    out["same"] = make_arm(root / "same", arm_videos(), attention="full")
    for sigma in (3, 10, 30):
        out[f"noise{sigma}"] = make_arm(
            root / f"noise{sigma}",
            arm_videos(sigma),
            attention="sage",
            pv="fp16",
            backend="reference",
            backends={"counts": {"reference/fp16": 4}, "fallbacks": {}},
        )
    return out


@pytest.fixture(scope="session")
def weights_dir(tmp_path_factory) -> Path:
    """A weights folder with a tiny CLIP and a random AlexNet backbone (no Inception file)."""
    import torch

    from sagevideo.eval.lpips import backbone_features
    from sagevideo.eval.weights import CLIP_FOLDER, LPIPS_FILES
    from tests.helpers.evalkit import tiny_clip

    root = tmp_path_factory.mktemp("weights")
    tiny_clip(root / CLIP_FOLDER)
    torch.manual_seed(1)
    features = backbone_features("alex")
    (root / "lpips").mkdir()
    torch.save({f"features.{k}": v for k, v in features.state_dict().items()}, root / "lpips" / LPIPS_FILES["alex"])
    return root


@pytest.fixture(scope="session")
def identical(arms, weights_dir, tmp_path_factory):
    """The reference against an identical copy, with the copy as the noise floor too (all metrics)."""
    from tests.helpers.evalkit import run_eval, single_thread

    out = tmp_path_factory.mktemp("identical")
    with single_thread():
        return run_eval(arms["ref"], arms["same"], out, weights_dir, noise=arms["same"]) | {"_out": out}


@pytest.fixture(scope="session")
def by_noise(arms, weights_dir, tmp_path_factory):
    """Evaluations of the noisy arms (sigma 3, 10, 30) against the reference; noise floor = the copy."""
    from tests.helpers.evalkit import run_eval, single_thread

    results = {}
    with single_thread():
        for s in (3, 10, 30):
            out = tmp_path_factory.mktemp(f"n{s}")
            results[s] = run_eval(arms["ref"], arms[f"noise{s}"], out, weights_dir, noise=arms["same"]) | {"_out": out}
    return results
