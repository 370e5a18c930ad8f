"""A time limit that stops a job in this process mid-step: SIGALRM raises in the main thread.

Python runs signal handlers between bytecodes, so the job stops between two torch operations
(not only after a denoising step); one operation that runs longer than the limit (a single huge
attention call) finishes first. Outside the main thread, or without SIGALRM (Windows), nothing is
armed and callers fall back to checking the limit after each step.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Iterator


class JobTimeoutError(RuntimeError):
    """A job ran past --job-timeout."""


def can_interrupt() -> bool:
    """Whether `deadline` can stop work here (the main thread of a POSIX process)."""
    return hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()


@contextlib.contextmanager
def deadline(seconds: float | None, what: str = "--job-timeout") -> Iterator[None]:
    """Raise JobTimeoutError inside the block once `seconds` have passed (None: no limit)."""
    if seconds is None or not can_interrupt():
        yield
        return
    start = time.monotonic()

    def expire(signum, frame):
        elapsed = time.monotonic() - start
        raise JobTimeoutError(f"ran past {what} {seconds:g} s (stopped mid-job after {elapsed:.0f} s)")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 1e-3))  # a 0 (from rounding) would disarm the timer
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous if previous is not None else signal.SIG_DFL)
