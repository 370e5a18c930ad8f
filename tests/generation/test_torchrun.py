"""`python -m sagevideo.generation.torchrun`: the same sequence-parallel pieces under plain torchrun, without Ray."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sagevideo.generation import torchrun as launcher
from tests.helpers.sp_tolerance import JOBS, assert_same_videos

ROOT = Path(__file__).resolve().parents[2]


def test_a_degree_the_jobs_cannot_take_stops_every_rank_before_loading(tmp_path, monkeypatch, capsys):
    import sagevideo.pipelines.loading as loading

    monkeypatch.setattr(loading, "load_pipeline", lambda *a, **k: pytest.fail("model loaded"))
    monkeypatch.setenv("WORLD_SIZE", "2")
    args = ["--out", str(tmp_path / "out"), "-p", "a cat", "--height", "48", "--width", "48", "--device", "cpu"]
    monkeypatch.setenv("RANK", "0")
    assert launcher.main(args) == 2
    error = ("sagevideo torchrun: error: job 1: --gpus-per-job 2: 253 tokens (226 text + 27 video) are not "
             "divisible by 2")
    assert error in capsys.readouterr().err
    monkeypatch.setenv("RANK", "1")  # the other ranks stop as well, silently
    assert launcher.main(args) == 2 and capsys.readouterr().err == ""


def test_a_job_files_step_cache_is_refused_for_several_ranks_before_loading(tmp_path, no_model_load, monkeypatch,
                                                                             capsys):
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text("recipe:\n  cache: first-block\njobs:\n  - a cat\n")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    assert launcher.main([str(jobs), "--out", str(tmp_path / "out"), "--device", "cpu"]) == 2
    error = "--cache first-block: step caching with --gpus-per-job 2 would let each rank decide"
    assert error in capsys.readouterr().err


@pytest.mark.slow
def test_torchrun_two_ranks_match_one_process(tmp_path):
    import sagevideo

    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(JOBS)
    sagevideo.generate(jobs, out=tmp_path / "one", device="cpu", progress=False)
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    args = ["-m", "sagevideo.generation.torchrun", str(jobs), "--out", str(tmp_path / "sp"), "--device", "cpu",
            "--no-progress"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([*torchrun, *args], capture_output=True, text=True, timeout=240, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "3 done, 0 skipped, 0 failed" in done.stdout and "2 ranks; rank 0 decodes and writes" in done.stderr
    records = [json.loads(line) for line in (tmp_path / "sp" / "manifest.jsonl").read_text().splitlines()]
    assert len(records) == 3 and {r["status"] for r in records} == {"done"}  # one writer: rank 0
    assert sorted(os.listdir(tmp_path / "sp")) == ["full.mp4", "killed.mp4", "manifest.jsonl", "sage.mp4"]
    assert_same_videos(tmp_path / "sp", tmp_path / "one")
