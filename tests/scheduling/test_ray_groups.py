"""`--gpus-per-job 2 --device cpu` on a local Ray instance (2 CPUs): one group of 2 gloo ranks.

Tolerance against one process with the same seed (`tests/helpers/sp_tolerance.py`): with
attention "full" the video is byte-identical; with sagevideo's quantized attention the decoded
frames agree to a mean of 1.5 levels of 255 (see there why not bit for bit).
One batch covers both the comparison and a rank killed mid-job, so that the test starts only two
groups (each rank imports torch and diffusers: ~8 s on two cores).
"""

from __future__ import annotations

import json
import os

import pytest
from typer.testing import CliRunner

pytest.importorskip("ray")

import sagevideo  # noqa: E402
from sagevideo.cli.app import app  # noqa: E402
from sagevideo.host import failpoints  # noqa: E402
from tests.helpers.sp_tolerance import JOBS, assert_same_videos  # noqa: E402

pytestmark = pytest.mark.slow


def manifest(out):
    return [json.loads(line) for line in (out / "manifest.jsonl").read_text().splitlines()]


def test_two_ranks_match_one_process_and_a_killed_rank_restarts_the_group(tmp_path, ray_local, monkeypatch):
    """Rank 1 exits in the middle of denoising the KILL job (rank 0 then waits for it in an
    all-to-all): the whole group is stopped, a new group runs the job again, and every job ends
    exactly once with the video one process makes."""
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(JOBS)
    one = sagevideo.generate(jobs, out=tmp_path / "one", device="cpu", progress=False)  # this process

    monkeypatch.setenv(failpoints.ENV, "mid-denoise=KILL:1@1")  # rank 1, first attempt only
    out = tmp_path / "sp"
    args = ["generate", str(jobs), "--out", str(out), "--device", "cpu", "--gpus-per-job", "2", "--no-progress"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "3 done, 0 skipped, 0 failed" in result.stdout and "Ray group(s) of 2 ranks" in result.stdout
    assert "1 job(s) retried after a worker died" in result.stdout
    assert "rank 0 decodes and writes" in result.stderr and "retrying job" in result.stderr

    lines = manifest(out)
    assert sorted(r["job_id"] for r in lines) == sorted(r["job_id"] for r in one)  # each job exactly once
    assert {r["status"] for r in lines} == {"done"}
    assert all(r["worker"]["ranks"] == 2 and r["worker"]["rank"] == 0 for r in lines)
    killed = next(r for r in lines if r["prompt"].startswith("KILL"))
    error = killed["retries"][0]["error"]
    assert killed["attempts"] == 2 and "rank 1 of group" in error and "died during the job" in error
    assert killed["worker"]["pid"] != killed["retries"][0]["worker"]["pid"]  # a new group's rank 0
    assert all(r["attempts"] == 1 for r in lines if r is not killed)
    assert sorted(os.listdir(out)) == ["full.mp4", "killed.mp4", "manifest.jsonl", "sage.mp4"]
    assert_same_videos(out, tmp_path / "one")
    # Rank 0 counts every attention call of a job (2 layers x 2 steps), as one process does; with
    # attention "full" one process installs nothing, while Ulysses runs SDPA in its own processors.
    by_id = {r["job_id"]: r for r in one}
    for r in lines:
        expected = {"sdpa": 4} if r["attention"] == "full" else by_id[r["job_id"]]["backends"]["counts"]
        assert r["backends"]["counts"] == expected, r["prompt"]
