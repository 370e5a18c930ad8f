"""The progress relay: workers' step reports, from their Ray queue to the driver's status line.

Workers put one short text per denoising step on a `ray.util.queue.Queue`
(`sagevideo.scheduling.worker.step_reporter`); `StepStatus.poll` shows the newest as the bar's
status. Progress is cosmetic: a queue that cannot be read is skipped, never an error.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger("sagevideo")

__all__ = ["StepStatus"]


class StepStatus:
    """Shows the newest step report of the running jobs as the bar's status text."""

    def __init__(self, steps_queue: Any, status: Callable[[str], None]):
        self.queue = steps_queue
        self.status = status

    def poll(self, running: int) -> None:
        """Show the newest step text the workers reported since the last poll."""
        try:
            count = self.queue.qsize()
            reports = self.queue.get_nowait_batch(count) if count else []
        except Exception:  # progress is cosmetic; the queue's actor may be gone at shutdown
            log.debug("could not read step reports", exc_info=True)
            return
        if reports:
            self.status(f"{running} running, {reports[-1]}" if running > 1 else reports[-1])
