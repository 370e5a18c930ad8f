"""The watcher's stop (`reaper._stop`); the watcher as a whole ends a local Ray instance with its driver
in tests/scheduling/test_cluster.py."""

import subprocess
import sys
import time

import psutil
import pytest

from sagevideo.scheduling import reaper


def test_stop_ends_at_once_when_what_it_stopped_waits_unreaped_as_a_zombie():
    """A process that exits on SIGTERM but whose parent has not reaped it yet (the driver, for Ray's GCS
    and raylet) is a zombie: it has ended, so the stop neither waits for it until the SIGKILL deadline
    (psutil.wait_procs did, a second at every normal end of a batch on Ray) nor kills anything."""
    child = subprocess.Popen(["sleep", "30"])  # this process is its parent: it stays a zombie until waited on
    try:
        started = time.monotonic()
        reaper._stop({psutil.Process(child.pid)})
        elapsed = time.monotonic() - started
        assert psutil.Process(child.pid).status() == psutil.STATUS_ZOMBIE
    finally:
        child.kill()
        child.wait()
    assert child.returncode == -15  # SIGTERM ended it, not the SIGKILL after the deadline
    assert elapsed < reaper.KILL_AFTER_S / 2


@pytest.mark.slow  # waits out the SIGKILL deadline
def test_stop_kills_what_outlives_sigterm_after_the_deadline():
    ignores_sigterm = ("import signal, time; "
                       "signal.signal(signal.SIGTERM, signal.SIG_IGN); print(flush=True); time.sleep(9)")
    child = subprocess.Popen([sys.executable, "-c", ignores_sigterm], stdout=subprocess.PIPE)
    child.stdout.readline()  # its handler is set
    started = time.monotonic()
    reaper._stop({psutil.Process(child.pid)})
    assert child.wait(10) == -9 and time.monotonic() - started >= reaper.KILL_AFTER_S
