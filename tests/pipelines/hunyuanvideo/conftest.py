"""The tiny HunyuanVideo pipeline, built once for this folder (tests that change it undo it), and a
local Ray instance for the one Ray test, set up as tests/scheduling/conftest.py sets up its own
(private, offline, small; Ray's nodes listen on this machine's own addresses)."""

import os
import shutil
import tempfile

import pytest


@pytest.fixture(scope="session")
def hunyuan_pipe():
    from sagevideo.pipelines.hunyuanvideo.tiny import tiny_pipeline

    pipe = tiny_pipeline()
    pipe.set_progress_bar_config(disable=True)
    return pipe


@pytest.fixture
def ray_hosts(allowed_hosts):
    """Let the network guard through to this machine's own addresses (where Ray listens)."""
    import socket

    import ray.util

    allowed_hosts.add(ray.util.get_node_ip_address())
    try:
        allowed_hosts.update(socket.gethostbyname_ex(socket.gethostname())[2])
    except OSError:
        pass
    return allowed_hosts


@pytest.fixture
def ray_local(ray_hosts):
    """A local Ray instance (2 CPUs, no auth, no usage statistics, sessions in a private folder)."""
    import ray

    saved = {name: os.environ.get(name) for name in ("RAY_AUTH_MODE", "RAY_USAGE_STATS_ENABLED", "RAY_TMPDIR")}
    temp = tempfile.mkdtemp(prefix="svray-")  # short: Ray puts unix sockets there
    os.environ.update(RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0", RAY_TMPDIR=temp)
    ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING", object_store_memory=80 * 2**20)
    try:
        yield ray
    finally:
        ray.shutdown()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        shutil.rmtree(temp, ignore_errors=True)
