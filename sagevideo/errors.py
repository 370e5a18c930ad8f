"""Every exception a user of sagevideo can meet, and the exit code the commands give for it.

    exception               exit  raised when
    InputError                 2  bad input found before any model loads (a field, an option, a file,
                                  --out in use by another run, a Ray address nobody answers)
    EvalInputError             2  bad input to `eval`/`ab` (unknown metric, unusable folder)
    PairingError               2  two output folders whose videos do not pair by prompt and seed
    ModelLoadError             1  the model passed its checks but could not be loaded
    BatchStopped               1  a batch ended early on its own (disk full, manifest unwritable)
    ABFailed                   1  a job of one `ab` arm failed (its manifest has the error)
    MetricModelError           1  a metric's weights are present but cannot be loaded
    OutputsNotWritten          1  the work finished but some of its files could not be written
    OSError, MemoryError       1  the machine's own problem (a full disk, a permission, memory): one
                                  line, no traceback
    BatchInterrupted         130  Ctrl-C (SIGINT) during a batch; 143 for SIGTERM, 129 for SIGHUP
    Terminated               143  SIGTERM (as SLURM, Kubernetes and `kill` send it); 129 for SIGHUP
                                  (a closed terminal or ssh session)

Exit code 1 also means "a job failed" (the batch went on; its record says why) and, for
`check-weights`, "some metric would be skipped". The CLI maps exceptions to codes through
`exit_code_for` only (`sagevideo.cli.common.handle_errors`).

This module imports nothing of sagevideo, so every room can raise from it.
"""

from __future__ import annotations

import signal
from typing import Any

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 128 + signal.SIGINT  # 130, as a shell reports a command stopped by Ctrl-C
EXIT_TERMINATED = 128 + signal.SIGTERM  # 143
EXIT_HUNG_UP = 128 + 1  # 129: SIGHUP is 1 on every POSIX system (Windows has none)


class SagevideoError(Exception):
    """Base of sagevideo's user-facing errors; `exit_code` is what the commands exit with."""

    exit_code = EXIT_FAILED


class InputError(SagevideoError, ValueError):
    """Bad user input found before any model is loaded; the message is ready to print
    (one line per problem, each naming the field or option and the fix)."""

    exit_code = EXIT_BAD_INPUT


class EvalInputError(SagevideoError, ValueError):
    """Bad input to `evaluate` (unknown metric, unusable output folder...), found before loading models."""

    exit_code = EXIT_BAD_INPUT


class PairingError(SagevideoError, ValueError):
    """Two folders whose videos cannot be paired; the message lists every problem."""

    exit_code = EXIT_BAD_INPUT


class ModelLoadError(SagevideoError, RuntimeError):
    """The model passed its checks but could not be loaded or prepared."""


class MetricModelError(SagevideoError, RuntimeError):
    """A metric's weights are present but could not be loaded (corrupt or of another model).

    `evaluate` itself skips such a metric (in metrics.json: skipped and failed) and computes the
    others; the commands raise this afterwards, so the exit code says a metric was lost."""


class PeakyAttentionError(SagevideoError, RuntimeError):
    """Attention past INT8's accuracy under the strict guard ("fail"): names the layers; the job fails."""


class OutputsNotWritten(SagevideoError, RuntimeError):
    """The work finished but some of its files could not be written (a full disk, a quota, a
    permission); every file that was written stays. The message names each file that was not, in
    one line; result: what the work computed (eval: the metrics.json content)."""

    def __init__(self, message: str, result: Any = None):
        super().__init__(message)
        self.result = result


class ABFailed(SagevideoError, RuntimeError):
    """A job of one arm failed (its manifest has the error); re-running resumes."""


class BatchStopped(SagevideoError, RuntimeError):
    """A batch ended early on its own: the output storage is full, or the manifest cannot be
    written. report: what finished (a `BatchReport`; `report.stopped` says why); re-running resumes."""

    def __init__(self, report: Any):
        super().__init__(report.stopped)
        self.report = report


class Terminated(KeyboardInterrupt):
    """SIGTERM (what SLURM, Kubernetes and `kill` send) or SIGHUP (a closed terminal or ssh session)
    during a batch: handled as Ctrl-C is. signum: which of the two."""

    def __init__(self, signum: int = signal.SIGTERM):
        super().__init__(signal.Signals(signum).name)
        self.signum = int(signum)

    @property
    def exit_code(self) -> int:
        """What a shell reports for a command the signal stopped: 143 (SIGTERM), 129 (SIGHUP)."""
        return 128 + self.signum


class BatchInterrupted(KeyboardInterrupt):
    """Ctrl-C, SIGTERM or SIGHUP during a batch: workers are stopped, finished jobs are in the manifest.

    report: what finished before the interrupt (a `BatchReport`: `report.interrupted` is True,
    `report.signal` says which signal: "SIGINT", "SIGTERM" or "SIGHUP").
    """

    def __init__(self, report: Any):
        super().__init__("interrupted")
        self.report = report

    @property
    def exit_code(self) -> int:
        """What a shell reports for a command the signal stopped: 130 (SIGINT), 143 (SIGTERM), 129 (SIGHUP)."""
        return {"SIGTERM": EXIT_TERMINATED, "SIGHUP": EXIT_HUNG_UP}.get(self.report.signal, EXIT_INTERRUPTED)


def exit_code_for(err: BaseException) -> int | None:
    """The exit code for a user-facing exception, or None for one that is a bug (let it show)."""
    if isinstance(err, (SagevideoError, BatchInterrupted, Terminated)):
        return err.exit_code
    if isinstance(err, KeyboardInterrupt):
        return EXIT_INTERRUPTED
    if isinstance(err, (OSError, MemoryError)):  # the environment's (disk, permissions, memory), not a bug's
        return EXIT_FAILED
    return None


def first_line(err: BaseException, skip: tuple[str, ...] = ("ray::", "Traceback"), limit: int = 300) -> str:
    """The first meaningful line of an exception's message, for one-line reports: lines starting
    with `skip` (Ray's task headers and quoted tracebacks run to dozens of lines) passed over, at
    most `limit` characters; the exception's type name when nothing is left."""
    for line in str(err).splitlines():
        line = line.strip()
        if line and not line.startswith(skip):
            return line[:limit]
    return type(err).__name__
