"""What one process hands back for a job it ran: `RankResult`, the same shape on every rank.

A plain worker is rank 0 of a group of one. Rank 0 carries the job's `ManifestRecord` (its
`handoff` naming the staged files, for the driver to commit); the other ranks of a
sequence-parallel group only say whether their share ran. The scheduler reads `status`,
`error` and `device_error` of every rank alike, and passes rank 0's record on to the driver.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from sagevideo.outputs.manifest import ManifestRecord

__all__ = ["RankResult"]


@dataclass(frozen=True)
class RankResult:
    """One rank's outcome of one job.

    status: "done" or "failed" (the job's own failure: an exception while it ran). error: why it
    failed. device_error: a CUDA or out-of-memory error (the process's GPU state is suspect, so a
    fresh worker should retry the job). record: rank 0's manifest record of the job; None on the
    other ranks."""

    rank: int
    status: Literal["done", "failed"]
    error: str | None = None
    device_error: bool = False
    record: ManifestRecord | None = None

    @classmethod
    def of_record(cls, record: ManifestRecord, rank: int = 0) -> RankResult:
        """Rank 0's result: the job's record, its status and errors read from it."""
        handoff = record.handoff
        return cls(
            rank=rank, status="done" if record.done else "failed", error=record.error,
            device_error=handoff is not None and handoff.device_error, record=record,
        )

    @property
    def failed(self) -> bool:
        return self.status == "failed"
