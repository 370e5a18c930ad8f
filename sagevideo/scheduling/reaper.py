"""A local Ray instance ends with its driver, however the driver ends (kill -9 included).

Ray ties its GCS server and raylet to the driver that started them (the kernel kills them with
it), but the agents the raylet starts (DashboardAgent, RuntimeEnvAgent) outlived a killed driver
by 35 to 80 s: they first report the raylet's death to the GCS that is gone, with a 60 s timeout
written into Ray. Ray has no option for that, so `start` launches this watcher, a small child
process in its own session (a closed terminal's SIGHUP or a Ctrl-C does not reach it), right after
`ray.init`, with the instance's processes. While the driver lives it follows their children every
POLL_S; when its stdin closes (the driver ended, or died: the kernel closes the pipe), it stops
every one still running (SIGTERM, then SIGKILL after KILL_AFTER_S) and exits.

    python -m sagevideo.scheduling.reaper PID:CREATE_TIME ...
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

POLL_S = 0.5
KILL_AFTER_S = 1.0
STOP_POLL_S = 0.02
FINISH_S = 10.0  # how long the driver waits for the watcher at its normal end


class Reaper:
    """The driver's end of the watcher: `finish()` at a normal end (after `ray.shutdown()`)."""

    def __init__(self, process: subprocess.Popen):
        self.process = process

    def finish(self, timeout_s: float = FINISH_S) -> None:
        """Tell the watcher the driver is done, and wait until it has stopped what is left."""
        with contextlib.suppress(OSError):
            self.process.stdin.close()
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:  # it goes on alone; nothing here must hang on it
            pass


def start(roots: list[Any]) -> Reaper:
    """Watch `roots` (psutil.Process objects: the processes `ray.init` started) and their children."""
    package_parent = str(Path(__file__).resolve().parents[2])  # where `sagevideo` is imported from here
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [package_parent, os.environ.get("PYTHONPATH")]))}
    args = [f"{p.pid}:{p.create_time()!r}" for p in roots]
    process = subprocess.Popen(
        [sys.executable, "-m", "sagevideo.scheduling.reaper", *args],
        stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, env=env, start_new_session=True,
    )
    return Reaper(process)


def main(argv: list[str]) -> None:
    """The watcher (see the module docstring)."""
    import psutil

    for signum in (signal.SIGINT, signal.SIGHUP):  # the terminal's; the driver's end is stdin's end
        signal.signal(signum, signal.SIG_IGN)
    tracked: set[psutil.Process] = set()
    for spec in argv:
        pid, _, created = spec.partition(":")
        with contextlib.suppress(psutil.Error, ValueError):
            process = psutil.Process(int(pid))
            if abs(process.create_time() - float(created)) < 1e-3:  # not a later process with the same pid
                tracked.add(process)
    fd = sys.stdin.fileno()
    while True:
        _follow(tracked)
        ready, _, _ = select.select([fd], [], [], POLL_S)
        if ready and not os.read(fd, 4096):
            break
    _follow(tracked)
    _stop(tracked)


def _follow(tracked: set) -> None:
    """Add the children of every tracked process; drop those gone (a zombie counts as gone)."""
    import psutil

    for process in list(tracked):
        try:
            if not _running(process):
                raise psutil.NoSuchProcess(process.pid)
            tracked.update(process.children(recursive=True))
        except psutil.Error:
            tracked.discard(process)


def _stop(tracked: set) -> None:
    """SIGTERM to every tracked process still running, SIGKILL to those left after KILL_AFTER_S."""
    import psutil

    running = []
    for process in tracked:
        with contextlib.suppress(psutil.Error):
            process.terminate()  # psutil checks it is still the same process (pid and start time)
            running.append(process)
    # Not psutil.wait_procs: a process that exited but that its parent (the driver, for Ray's GCS and
    # raylet) has not reaped yet stays a zombie, which wait_procs counts as running to its timeout.
    deadline = time.monotonic() + KILL_AFTER_S
    while (running := [process for process in running if _running(process)]) and time.monotonic() < deadline:
        time.sleep(STOP_POLL_S)
    for process in running:
        with contextlib.suppress(psutil.Error):
            process.kill()


def _running(process) -> bool:
    """Whether a psutil.Process still runs: the same process (pid and start time), not a zombie."""
    import psutil

    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


if __name__ == "__main__":
    main(sys.argv[1:])
