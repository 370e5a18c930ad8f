"""The JSON-lines manifest: durable appends, latest record per job, torn lines survived."""

import json

import pytest

from sagevideo.outputs.manifest import Manifest, is_done


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
    with pytest.warns(UserWarning, match="line 2 is not valid JSON"):
        assert list(m.latest()) == ["a"]
    m.append({"job_id": "c", "status": "done"})
    with pytest.warns(UserWarning):
        assert list(m.latest()) == ["a", "c"]


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
