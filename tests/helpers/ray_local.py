"""A private local Ray instance for the few tests outside tests/scheduling that need one: no auth
token, no usage report, sessions in a temporary folder, the environment put back afterwards; and
this machine's own addresses, where Ray's nodes listen (Ray rewrites 127.0.0.1 to them)."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import tempfile
from collections.abc import Iterator
from typing import Any

OBJECT_STORE_BYTES = 80 * 2**20  # jobs return file names; Ray's default would take 30% of RAM
RAY_ENV = {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}


def own_addresses() -> set[str]:
    """Loopback and the addresses of this machine (where Ray's nodes listen)."""
    import ray.util

    found = {"127.0.0.1", "::1", "localhost", ray.util.get_node_ip_address()}
    try:
        found.update(socket.gethostbyname_ex(socket.gethostname())[2])
    except OSError:
        pass
    return found


@contextlib.contextmanager
def private_local_ray() -> Iterator[Any]:
    """`ray` with one local instance (2 CPUs) started, for the block; then shut down, its folder
    removed and the Ray variables of the environment as they were."""
    saved = {name: os.environ.get(name) for name in (*RAY_ENV, "RAY_TMPDIR")}
    temp = tempfile.mkdtemp(prefix="svray-")  # short: Ray puts unix sockets there
    os.environ.update(RAY_ENV, RAY_TMPDIR=temp)
    import ray

    ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING", object_store_memory=OBJECT_STORE_BYTES)
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
