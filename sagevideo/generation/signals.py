"""Ctrl-C, SIGTERM and SIGHUP during a batch: each stops it the same way (workers stopped, what
finished kept, the summary, the resume hint); the exit status says which, as a shell would:
130 (SIGINT), 143 (SIGTERM), 129 (SIGHUP: a closed terminal or ssh session).

A handler raises in the main thread (`KeyboardInterrupt` for SIGINT, `Terminated` for the other
two) and also notes the signal, because the exception can be lost on its way: CPython discards
what a handler raises inside a fork hook or a `__del__` ("Exception ignored in ..."), a library
may catch it, and Ray's blocking calls turn it into a plain KeyboardInterrupt. The run looks at
the notes at its checkpoints (`StopSignals.check`: each job's start, each denoising step or step
report, each finished job), so a lost signal still stops it there; a job that failed after a stop
signal is not recorded (the signal may be why it failed). A commit holds them (`StopSignals.held`).
A signal its parent set to be ignored (`nohup`, a background job) stays ignored.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any

from sagevideo.errors import Terminated

# The signals that stop a run; SIGHUP where the platform has it.
STOP = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name))


class StopSignals:
    """The stop signals of one run. noted: their numbers, in order of arrival. stopping: the stop
    is under way (its exception reached the run), so checkpoints raise no more."""

    def __init__(self) -> None:
        self.noted: list[int] = []
        self.stopping = False
        self._held = 0

    @property
    def name(self) -> str | None:
        """'SIGINT', 'SIGTERM' or 'SIGHUP': the first signal noted (None: none came)."""
        return signal.Signals(self.noted[0]).name if self.noted else None

    def handle(self, signum: int, frame: Any) -> None:
        """The handler: note the signal; raise its exception unless a commit holds it."""
        self.noted.append(signum)
        if not self._held:
            raise exception_for(signum)

    def check(self) -> None:
        """A checkpoint: raise for a signal that came and whose exception was lost on its way."""
        if self.noted and not self.stopping:
            raise exception_for(self.noted[0])

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """Hold stop signals for the few milliseconds of a commit (a video's rename and its manifest
        line go together), then raise one that came."""
        self._held += 1
        try:
            yield
        finally:
            self._held -= 1
        self.check()


def exception_for(signum: int) -> KeyboardInterrupt:
    """KeyboardInterrupt for SIGINT; Terminated(signum) for SIGTERM and SIGHUP."""
    return KeyboardInterrupt() if signum == signal.SIGINT else Terminated(signum)


@contextlib.contextmanager
def stop_signals() -> Iterator[StopSignals]:
    """For the whole run, SIGINT, SIGTERM and SIGHUP go to one `StopSignals` (main thread only:
    elsewhere nothing is installed and nothing is noted); the previous handlers are put back after."""
    signals = StopSignals()
    if threading.current_thread() is not threading.main_thread():
        yield signals  # signal handlers live in the main thread only
        return
    previous = {}
    for signum in STOP:
        if signal.getsignal(signum) is not signal.SIG_IGN:
            previous[signum] = signal.signal(signum, signals.handle)
    try:
        yield signals
    finally:
        signals.stopping = True
        for signum, handler in previous.items():
            # None: the old handler was not set from Python; Python's own is the sane one to restore.
            default = signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL
            signal.signal(signum, handler if handler is not None else default)


def signal_name(stop: KeyboardInterrupt, signals: StopSignals) -> str:
    """Which signal stopped the run: the first noted, else what the exception says (SIGINT for a
    plain KeyboardInterrupt)."""
    if signals.name:
        return signals.name
    return signal.Signals(stop.signum).name if isinstance(stop, Terminated) else "SIGINT"
