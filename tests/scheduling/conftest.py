"""Ray set-up for the scheduling tests: private, offline, small (the instance itself is
tests/conftest.py's `ray_local`, shared with the other Ray tests of the pytest process).

Ray writes an auth token under the home folder and its sessions under /tmp/ray unless told
otherwise, and reports usage statistics unless disabled: all three are switched off here,
before any test starts Ray. Ray nodes listen on this machine's own address (Ray rewrites
127.0.0.1 to it), so the network guard also lets connections to this machine's addresses through.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

import pytest

from tests.helpers.ray_local import own_addresses

os.environ["RAY_AUTH_MODE"] = "disabled"
os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
os.environ["RAY_TMPDIR"] = tempfile.mkdtemp(prefix="svray-")  # short: Ray puts unix sockets there
atexit.register(shutil.rmtree, os.environ["RAY_TMPDIR"], ignore_errors=True)  # session logs, sockets


@pytest.fixture
def allowed_hosts() -> set[str]:
    """Ray 2.60 rewrites 127.0.0.1 to this machine's own IP: allow its own addresses too
    (traffic stays on the host); tests/conftest.py's `no_network` guard uses this set."""
    return own_addresses()
