"""Sequence parallelism on two GPUs (NCCL) gives one GPU's videos: under torchrun, and with each
rank started as Ray starts a rank actor (it sees only its own GPU until `torchrun_env` shows it the
group's). GPU-only (`pytest -m gpu`, two CUDA GPUs); the CPU runs of the same pieces are in
test_torchrun.py and tests/scheduling."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.helpers.sp_tolerance import JOBS, assert_same_videos

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.gpu, pytest.mark.slow,
              pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")]
RANK_COMMAND = ["-m", "sagevideo.generation.torchrun"]


@pytest.fixture(scope="module")
def one_gpu(tmp_path_factory):
    """The jobs file and the videos one GPU makes of it (this process, no Ray)."""
    import sagevideo

    folder = tmp_path_factory.mktemp("sp-gpu")
    jobs = folder / "jobs.yaml"
    jobs.write_text(JOBS)
    sagevideo.generate(jobs, out=folder / "one", device="cuda", workers=1, progress=False)
    return jobs, folder / "one"


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]), **extra}


def _assert_all_done(out: Path) -> None:
    records = [json.loads(line) for line in (out / "manifest.jsonl").read_text().splitlines()]
    assert len(records) == 3 and {r["status"] for r in records} == {"done"}
    assert all("triton" in "".join(r["backends"]["counts"]) for r in records if r["attention"] != "full"), records


def test_torchrun_on_two_gpus_matches_one_gpu(one_gpu, tmp_path):
    jobs, single = one_gpu
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    done = subprocess.run([*torchrun, *RANK_COMMAND, str(jobs), "--out", str(tmp_path / "sp"), "--device", "cuda",
                           "--no-progress"], capture_output=True, text=True, timeout=600, env=_env())
    assert done.returncode == 0, done.stderr[-3000:]
    _assert_all_done(tmp_path / "sp")
    assert_same_videos(tmp_path / "sp", single)


def test_ranks_started_as_ray_starts_them_match_one_gpu(one_gpu, tmp_path):
    """Each process is shown only its own GPU (CUDA_VISIBLE_DEVICES, as Ray shows an actor), then
    the variables `torchrun_env` gives a rank actor replace that before CUDA starts."""
    from sagevideo.scheduling.group import free_port, torchrun_env

    jobs, single = one_gpu
    places = [{"rank": 0, "ip": "127.0.0.1", "gpus": ["0"], "port": free_port("127.0.0.1")},
              {"rank": 1, "ip": "127.0.0.1", "gpus": ["1"]}]
    assert torchrun_env(1, places)["CUDA_VISIBLE_DEVICES"] == "0,1"
    args = [*RANK_COMMAND, str(jobs), "--out", str(tmp_path / "sp"), "--device", "cuda", "--no-progress"]
    ranks = [subprocess.Popen([sys.executable, *args], env=_env(CUDA_VISIBLE_DEVICES=str(rank),
                                                                 **torchrun_env(rank, places)))
             for rank in range(2)]
    assert [rank.wait(timeout=600) for rank in ranks] == [0, 0]
    _assert_all_done(tmp_path / "sp")
    assert_same_videos(tmp_path / "sp", single)
