"""A rank's result (`host/result.py`): one shape on every rank, rank 0's carrying the job's record."""

from __future__ import annotations

from sagevideo.host.result import RankResult
from sagevideo.outputs.manifest import Handoff, ManifestRecord


def test_rank_0s_result_reads_status_and_errors_from_its_record():
    done = ManifestRecord(job_id="j", status="done", handoff=Handoff(staged=".j.mp4.staged"))
    result = RankResult.of_record(done)
    assert (result.rank, result.status, result.error, result.device_error) == (0, "done", None, False)
    assert result.record is done and not result.failed

    oom = ManifestRecord(job_id="j", status="failed", error="OutOfMemoryError: CUDA out of memory",
                         handoff=Handoff(device_error=True))
    failed = RankResult.of_record(oom)
    assert failed.failed and failed.device_error and failed.error == oom.error


def test_a_record_without_a_handoff_is_no_device_error():
    result = RankResult.of_record(ManifestRecord(job_id="j", status="failed", error="NonFiniteError: NaN"))
    assert result.failed and not result.device_error


def test_other_ranks_carry_no_record():
    share = RankResult(1, "failed", "RuntimeError: boom", device_error=False)
    assert share.record is None and share.failed and share.rank == 1
