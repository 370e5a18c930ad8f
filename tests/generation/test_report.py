"""What a run did (`generation/report.py`): counts from the records and the one summary line."""

from __future__ import annotations

from sagevideo.generation.generate import plan_batch
from sagevideo.generation.report import BatchReport
from sagevideo.outputs.manifest import ManifestRecord


def test_the_summary_counts_records_and_the_attention_that_ran(tmp_path):
    plan = plan_batch(["a", "b"], out=tmp_path)
    report = BatchReport(plan=plan, records=[None, None])
    said = []
    done = ManifestRecord(job_id=plan.jobs[0].job_id, status="done",
                          backends={"counts": {"reference/fp16": 4}, "fallbacks": {}})
    failed = ManifestRecord(job_id=plan.jobs[1].job_id, status="failed", error="NonFiniteError: NaN", attempts=2)
    report.add(0, done, said.append)
    report.add(1, failed, said.append)
    assert (report.done, report.failed, report.retried, report.ok) == (1, 1, 1, False)
    assert said == [f"sagevideo: job {failed.job_id} (job 2) failed: NonFiniteError: NaN"]
    line = report.summary_line()
    assert line.startswith("sagevideo: 1 done, 0 skipped, 1 failed → ") and "attention: reference/fp16 x4" in line
    assert "1 job(s) retried after a worker died" in line
