"""The driver's end of a job (`generation/commit.py`): staged outputs renamed into place with
their manifest line, or not at all."""

from __future__ import annotations

from sagevideo.generation.commit import Committer
from sagevideo.generation.generate import plan_batch
from sagevideo.generation.report import BatchReport
from sagevideo.outputs.manifest import Handoff, Manifest, ManifestRecord, ManifestWriteError


def committer(tmp_path):
    plan = plan_batch(["a cat"], out=tmp_path)
    manifest = Manifest(plan.manifest_path)
    report = BatchReport(plan=plan, records=[None])
    return plan, manifest, report, Committer(plan, manifest, [], report, lambda line: None)


def staged_record(plan, tmp_path):
    pj = plan.jobs[0]
    (tmp_path / f".{pj.output}.staged").write_bytes(b"mp4")
    return ManifestRecord(job_id=pj.job_id, status="done", handoff=Handoff(staged=f".{pj.output}.staged"))


def test_a_done_job_is_renamed_into_place_and_recorded(tmp_path):
    plan, manifest, report, commit = committer(tmp_path)
    commit.finish(0, staged_record(plan, tmp_path))
    output = plan.jobs[0].output
    assert (tmp_path / output).read_bytes() == b"mp4" and not (tmp_path / f".{output}.staged").exists()
    (line,) = manifest.records()
    assert line.outputs == [output] and line.handoff is None and report.done == 1


def test_a_line_that_cannot_be_written_undoes_the_rename_and_stops(tmp_path, monkeypatch):
    plan, manifest, report, commit = committer(tmp_path)

    def full(self, record):
        raise ManifestWriteError("disk full")

    monkeypatch.setattr(Manifest, "append", full)
    commit.finish(0, staged_record(plan, tmp_path))
    output = plan.jobs[0].output
    assert not (tmp_path / output).exists() and (tmp_path / f".{output}.staged").exists()
    assert report.stopped and report.done == 0 and not report.ok
