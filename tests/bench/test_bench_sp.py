"""CPU smoke test of bench/bench_sp.py in --tiny mode: it runs end to end (with the profiler
breakdown), prints its table and writes its JSON. The numbers mean nothing on CPU.
(bench/bench_batch.py is only `sagevideo.generate` on Ray twice, which tests/scheduling covers.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # each starts processes that import torch and diffusers (~1 min)
ROOT = Path(__file__).resolve().parents[2]


def run(args: list[str], tmp_path: Path) -> str:
    env = dict(os.environ, HF_HUB_OFFLINE="1", RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="disabled",
               RAY_TMPDIR=tempfile.mkdtemp(prefix="svray-"))  # short: Ray puts unix sockets there
    done = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_bench_sp_tiny(tmp_path):
    out = tmp_path / "sp.json"
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    args = ["bench/bench_sp.py", "--tiny", "--repeats", "2", "--warmup", "1", "--profile", "--json", str(out)]
    stdout = run([*torchrun, *args], tmp_path)
    report = json.loads(out.read_text())
    assert "speedup" in stdout and "kernel time by category" in stdout and report["world"] == 2
    for mode in ("sage", "sdpa"):
        row = report["modes"][mode]
        assert row["max_abs_diff"] < 1e-5 and row["cosine"] > 0.99999  # sharded = unsharded
    # 2 layers x (1 warm-up + 2 timed + 1 profiled) forwards
    assert report["modes"]["sage"]["backends_1"]["counts"] == {"reference/fp16": 8}
    assert all(b["counts"] == {"reference/fp16": 8} for b in report["modes"]["sage"]["backends_n"])
    assert "matmuls" in report["modes"]["sage"]["kernels_n"]
