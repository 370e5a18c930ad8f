"""Shared test set-up: nothing may be downloaded or reach the network.

Hub and torch caches point at empty temporary folders (set before any test imports diffusers,
whose hub constants are read at import), HF_HUB_OFFLINE=1 makes hub lookups fail at once, and
an autouse fixture refuses socket connections to anything but loopback.
"""

from __future__ import annotations

import os
import socket
import tempfile

import pytest

_CACHE = tempfile.mkdtemp(prefix="sagevideo-tests-cache-")
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_HOME"] = os.path.join(_CACHE, "hf")
os.environ["TORCH_HOME"] = os.path.join(_CACHE, "torch")
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
