"""The JSON-lines manifest: durable appends, latest record per job, torn lines survived."""

import json
import warnings

import pytest

from sagevideo.outputs.manifest import Manifest, ManifestWriteError, is_done


def test_append_and_latest(tmp_path):
    m = Manifest(tmp_path / "manifest.jsonl")
    assert m.records() == [] and m.latest() == {}
    m.append({"job_id": "a", "status": "failed", "prompt": "écrire 🐕"})
    m.append({"job_id": "b", "status": "done"})
    m.append({"job_id": "a", "status": "done"})
    assert [r["job_id"] for r in m.records()] == ["a", "b", "a"]
    assert m.latest()["a"]["status"] == "done"
    lines = (tmp_path / "manifest.jsonl").read_text(encoding="utf-8").splitlines()
    assert len(lines) == 3 and json.loads(lines[0])["prompt"] == "écrire 🐕"


def test_torn_last_line_is_skipped_and_next_append_starts_fresh(tmp_path):
    path = tmp_path / "manifest.jsonl"
    m = Manifest(path)
    m.append({"job_id": "a", "status": "done"})
    with path.open("a") as f:
        f.write('{"job_id": "b", "sta')  # a run killed mid-write
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no UserWarning (with a source line) on every read
        assert list(m.latest()) == ["a"]
    assert [(bad.number, bad.reason) for bad in m.bad_lines] == [(2, "not valid JSON (a torn write?)")]
    m.append({"job_id": "c", "status": "done"})
    assert list(m.latest()) == ["a", "c"]


@pytest.mark.parametrize(
    "line, reason",
    [
        ('{"job_id": "x", "status": "done", "outputs": 5}', "field outputs: Input should be a valid list (got 5)"),
        ('{"job_id": ["x"], "status": "done"}', "field job_id: Input should be a valid string"),
        ('{"job_id": "x", "seed": "3"}', "field seed: Input should be a valid integer"),
        ('{"job_id": "x", "outputs": ["a.mp4", 7]}', "field outputs.1: Input should be a valid string"),
        ("[1, 2]", "a JSON list, not a record"),
    ],
)
def test_valid_json_with_a_wrong_typed_field_is_set_aside_not_a_crash(tmp_path, line, reason):
    path = tmp_path / "manifest.jsonl"
    path.write_text('{"job_id": "a", "status": "done", "outputs": ["a.mp4"]}\n' + line + "\n")
    m = Manifest(path)
    assert list(m.latest()) == ["a"]
    (bad,) = m.bad_lines
    assert bad.number == 2 and bad.reason.startswith(reason)


def test_bad_lines_are_quarantined_once(tmp_path):
    path = tmp_path / "manifest.jsonl"
    path.write_text('{"job_id": "a"}\n{"job_id": "b", "sta\n{"job_id": 3}\n')
    m = Manifest(path)
    first = m.quarantine()
    assert len(first) == 2 and first[0].startswith("manifest.jsonl line 2 is not a usable record (not valid JSON")
    assert "copied to manifest.bad-lines.jsonl" in first[0]
    kept = [json.loads(x) for x in (tmp_path / "manifest.bad-lines.jsonl").read_text().splitlines()]
    assert [(k["line"], k["text"]) for k in kept] == [(2, '{"job_id": "b", "sta'), (3, '{"job_id": 3}')]
    assert m.quarantine() == [] and Manifest(path).quarantine() == []  # said once, not on every run
    assert path.read_text().count("\n") == 3  # the manifest itself is untouched


def test_nan_is_refused(tmp_path):
    with pytest.raises(ValueError):
        Manifest(tmp_path / "m.jsonl").append({"job_id": "a", "x": float("nan")})


def test_is_done(tmp_path):
    (tmp_path / "v.mp4").write_bytes(b"x")
    assert is_done({"status": "done", "outputs": ["v.mp4"]}, tmp_path)
    assert not is_done({"status": "done", "outputs": ["gone.mp4"]}, tmp_path)
    assert not is_done({"status": "done", "outputs": []}, tmp_path)
    assert not is_done({"status": "failed", "outputs": ["v.mp4"]}, tmp_path)
    assert not is_done(None, tmp_path)


def test_append_that_hits_a_full_disk_leaves_no_torn_line(tmp_path, monkeypatch):
    """A write cut short by ENOSPC: what got written is cut off again, so the file keeps whole lines only
    (the old append wrote half a line and raised a bare OSError)."""
    import errno
    import os

    import sagevideo.outputs.manifest as manifest_module

    path = tmp_path / "manifest.jsonl"
    m = Manifest(path)
    m.append({"job_id": "a", "status": "done"})
    before = path.read_bytes()
    real_write = os.write
    calls = []

    def short_then_full(fd, data):
        calls.append(len(data))
        if len(calls) == 1:
            return real_write(fd, bytes(data[: len(data) // 2]))  # a short write, as at the last free block
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(manifest_module.os, "write", short_then_full)
    full = r"manifest.jsonl: a record could not be written \(disk full \(ENOSPC\)\)"
    with pytest.raises(ManifestWriteError, match=full):
        m.append({"job_id": "b", "status": "done", "prompt": "x" * 200})
    assert len(calls) == 2 and path.read_bytes() == before
    monkeypatch.undo()
    m.append({"job_id": "c", "status": "done"})
    assert [r["job_id"] for r in m.records()] == ["a", "c"]


def test_append_whose_fsync_fails_is_cut_off(tmp_path, monkeypatch):
    import errno

    import sagevideo.outputs.manifest as manifest_module

    path = tmp_path / "manifest.jsonl"
    Manifest(path).append({"job_id": "a", "status": "done"})
    before = path.read_bytes()

    def fail(fd):
        raise OSError(errno.EDQUOT, "Disk quota exceeded")  # network file systems report it at fsync

    monkeypatch.setattr(manifest_module.os, "fsync", fail)
    with pytest.raises(ManifestWriteError, match=r"disk quota exceeded \(EDQUOT\)") as err:
        Manifest(path).append({"job_id": "b", "status": "done"})
    assert err.value.errno == errno.EDQUOT and path.read_bytes() == before


def test_append_under_a_file_size_limit_in_a_real_process(tmp_path):
    """`ulimit -f` in a child process: the kernel cuts the write at the limit (Python ignores SIGXFSZ,
    so the write returns short, then EFBIG); the line goes whole or not at all."""
    import resource
    import subprocess
    import sys

    path = tmp_path / "manifest.jsonl"
    Manifest(path).append({"job_id": "a", "status": "done"})
    before = path.read_bytes()
    limit = len(before) + 100  # room for part of the next line only
    code = (
        "import sys; from sagevideo.outputs.manifest import Manifest, ManifestWriteError\n"
        "try:\n"
        f"    Manifest({str(path)!r}).append({{'job_id': 'b', 'status': 'done', 'prompt': 'x' * 400}})\n"
        "except ManifestWriteError as err:\n"
        "    print(err); sys.exit(3)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit)),
        capture_output=True,
        text=True,
    )
    assert done.returncode == 3, done.stderr
    assert "file-size limit reached (EFBIG" in done.stdout and not done.stderr
    assert path.read_bytes() == before


# --- the typed record: versions, the JSON view, the worker's handoff ------------------------------


def test_v1_lines_read_and_new_lines_carry_the_schema(tmp_path):
    from sagevideo.outputs.manifest import SCHEMA_VERSION, ManifestRecord

    path = tmp_path / "manifest.jsonl"
    v1 = {"job_id": "a", "status": "done", "outputs": ["a.mp4"], "seed": 3, "retries": None, "attempts": None,
          "made_by": "another tool"}
    path.write_text(json.dumps(v1) + "\n")  # a line written before the schema key existed
    m = Manifest(path)
    (record,) = m.records()
    assert isinstance(record, ManifestRecord) and record.schema_version == SCHEMA_VERSION == 2
    assert (record.seed, record.outputs, record.retries, record.attempts) == (3, ["a.mp4"], [], 1)
    assert record["made_by"] == "another tool"  # unknown keys are kept as they are
    m.append(record.replace(status="failed", error="boom"))
    again = json.loads(path.read_text().splitlines()[1])
    assert again["schema"] == 2 and again["made_by"] == "another tool" and again["error"] == "boom"
    assert list(again)[:2] == ["schema", "job_id"]


def test_a_newer_schema_is_set_aside_not_misread(tmp_path):
    path = tmp_path / "manifest.jsonl"
    path.write_text('{"schema": 9, "job_id": "a", "status": "done"}\n{"schema": 2, "job_id": "b"}\n')
    m = Manifest(path)
    assert list(m.latest()) == ["b"]
    (bad,) = m.bad_lines
    assert bad.reason == "schema 9: written by a newer sagevideo (this one reads up to 2)"


def test_record_fields_are_typed_and_its_json_reads_like_a_dict(tmp_path):
    from pydantic import ValidationError

    from sagevideo.outputs.manifest import Handoff, ManifestRecord

    record = ManifestRecord(job_id="a", prompt="p", worker={"host": "h", "pid": 1, "node": None, "ranks": 2})
    with pytest.raises(ValidationError):
        record.attempts = "two"
    record.status, record.outputs = "done", ["a.mp4"]
    assert record["worker"] == {"host": "h", "pid": 1, "node": None, "ranks": 2} and record.get("nope", 5) == 5
    assert set(record) == set(record.to_json()) and "schema" in record and record.video == "a.mp4"
    record.handoff = Handoff(staged=".a.mp4.staged", device_error=True)
    Manifest(tmp_path / "m.jsonl").append(record)
    line = json.loads((tmp_path / "m.jsonl").read_text())
    assert "handoff" not in line and line == record.replace(handoff=None)  # a record equals its JSON line


def test_a_newer_schema_is_named_for_a_run_that_would_write_there(tmp_path):
    """What `generate` refuses with: the newest schema found, its line, and this version's."""
    path = tmp_path / "manifest.jsonl"
    path.write_text('{"schema": 2, "job_id": "a"}\n{"schema": 3, "job_id": "b"}\n{"schema": 4, "job_id": "c"}\n')
    problem = Manifest(path).newer_schema_problem()
    assert problem.startswith("manifest.jsonl line 3 was written by a newer sagevideo (manifest schema 4; ")
    assert "reads and writes schema 2)" in problem and "give another --out" in problem
    path.write_text('{"job_id": "a"}\n{"schema": 2, "job_id": "b"}\n{"job_id": "c", "sta\n')
    assert Manifest(path).newer_schema_problem() is None  # v1, v2 and torn lines are this version's to handle
