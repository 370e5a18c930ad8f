"""The local Ray instance of the tests that run on one (`ray_local` in tests/conftest.py): private,
no auth token, no usage report, sessions in a temporary folder, the environment put back
afterwards; and this machine's own addresses, where Ray's nodes listen (Ray rewrites 127.0.0.1 to
them)."""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
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


class SharedRay:
    """The pytest process's one local Ray instance (2 CPUs), started by the first test that asks
    for it and kept for the next ones (each start costs seconds: Ray's head, raylet and agents);
    stop() ends it, for a test that needs Ray not running in this process or at the session's end.
    While it runs, RAY_ENV and a RAY_TMPDIR of its own are set; stop() puts them back."""

    def __init__(self) -> None:
        self._saved: dict[str, str | None] | None = None
        self._temp = ""

    def start(self) -> Any:
        import ray

        if self._saved is None:
            assert not ray.is_initialized(), "Ray was started in this process by something else"
            self._saved = {name: os.environ.get(name) for name in (*RAY_ENV, "RAY_TMPDIR")}
            self._temp = tempfile.mkdtemp(prefix="svray-")  # short: Ray puts unix sockets there
            os.environ.update(RAY_ENV, RAY_TMPDIR=self._temp)
            ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING",
                     object_store_memory=OBJECT_STORE_BYTES)
        return ray

    def stop(self) -> None:
        if self._saved is None:
            return
        import ray

        ray.shutdown()
        for name, value in self._saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        shutil.rmtree(self._temp, ignore_errors=True)
        self._saved = None
