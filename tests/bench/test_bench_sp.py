"""CPU smoke test of bench/bench_sp.py in --tiny mode: it runs end to end on two gloo ranks (with the
profiler breakdown), prints its table and writes its JSON. The numbers mean nothing on CPU.
(bench/bench_batch.py is only `sagevideo.generate` on Ray twice, which tests/scheduling covers.)"""

from __future__ import annotations

import json

import pytest

from bench import bench_sp
from tests.helpers.torchrun_ranks import as_torchrun


@pytest.mark.slow  # two gloo ranks
def test_bench_sp_tiny(tmp_path, two_ranks):
    out = tmp_path / "sp.json"
    args = ["--tiny", "--repeats", "2", "--warmup", "1", "--profile", "--json", str(out)]
    ranks = as_torchrun(two_ranks, bench_sp.main, args, tmp_path / "logs")
    assert [rank["code"] for rank in ranks] == [0, 0], ranks[0]["stderr"]
    report = json.loads(out.read_text())
    assert "speedup" in ranks[0]["stdout"] and "kernel time by category" in ranks[0]["stdout"]
    assert report["world"] == 2
    for mode in ("sage", "sdpa"):
        row = report["modes"][mode]
        assert row["max_abs_diff"] < 1e-5 and row["cosine"] > 0.99999  # sharded = unsharded
    # 2 layers x (1 warm-up + 2 timed + 1 profiled) forwards
    assert report["modes"]["sage"]["backends_1"]["counts"] == {"reference/fp16": 8}
    assert all(b["counts"] == {"reference/fp16": 8} for b in report["modes"]["sage"]["backends_n"])
    assert "matmuls" in report["modes"]["sage"]["kernels_n"]
