"""The tiny HunyuanVideo pipeline, built once for this folder (tests that change it undo it), and a
local Ray instance for the one Ray test, set up as tests/scheduling/conftest.py sets up its own
(private, offline, small; Ray's nodes listen on this machine's own addresses)."""

import pytest

from tests.helpers.ray_local import own_addresses, private_local_ray


@pytest.fixture(scope="session")
def hunyuan_pipe():
    from sagevideo.pipelines.hunyuanvideo.tiny import tiny_pipeline

    pipe = tiny_pipeline()
    pipe.set_progress_bar_config(disable=True)
    return pipe


@pytest.fixture
def ray_hosts(allowed_hosts):
    """Let the network guard through to this machine's own addresses (where Ray listens)."""
    allowed_hosts.update(own_addresses())
    return allowed_hosts


@pytest.fixture
def ray_local(ray_hosts):
    """A private local Ray instance (2 CPUs) for the test."""
    with private_local_ray() as ray:
        yield ray
