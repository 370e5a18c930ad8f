"""bench/bench_ab_commit.py's rows for the results file (CPU: from a recorded GPU row)."""

from bench import bench_ab_commit
from bench.results import load, one, start_run

BASE = "0a492ef56ab2f775f935c97b2765fe30dfffa578"
HEAD = "f80f196f7a34cf11901f381a04d21c94554c646a"


def ab_row(dtype: str = "bf16") -> dict:
    ms = {"cudnn": 11.8, "base": 8.31, "head": 8.32, "head-prep": 0.26, "head-kernel": 8.0}
    return {"shape": "cogvideox-2b", "dims": [2, 30, 17776, 64], "dtype": dtype, "pv": "fp8", "ms": ms,
            "ms_reps": {key: [t] * 3 for key, t in ms.items()}, "errors": {"base-prep": "no such kernel"},
            "ran": {"head": "triton/fp8", "base": "triton/fp8"}, "base_commit": BASE, "gpu": "NVIDIA H200"}


def test_each_side_is_a_variant_and_the_base_rows_name_the_base_commit(monkeypatch, tmp_path):
    monkeypatch.setenv("BENCH_COMMIT", HEAD)
    run = bench_ab_commit.result_rows(start_run("bench_ab_commit", "NVIDIA H200", ["--pv", "fp8"]), [ab_row()])
    assert run.append(tmp_path / "r.jsonl") == 6
    rows = load(tmp_path / "r.jsonl")
    head, base = (one(rows, variant=f"{side}[pv=fp8]", metric="ms") for side in ("head", "base"))
    assert (head.value, head.commit, head.extra) == (8.32, HEAD, {"reps": [8.32] * 3, "ran": "triton/fp8"})
    assert (base.value, base.commit) == (8.31, BASE)
    assert one(rows, variant="cudnn[pv=fp8]").commit == HEAD  # measured in the head's run
    assert one(rows, variant="head-kernel[pv=fp8]").extra["ran"] == "triton/fp8"
    error = one(rows, variant="base-prep[pv=fp8]", metric="error")
    assert error.commit == BASE and error.extra == {"error": "no such kernel"}


def test_a_dtype_other_than_bf16_is_a_parameter():
    run = bench_ab_commit.result_rows(start_run("bench_ab_commit", "NVIDIA H200", []), [ab_row("fp16")])
    assert "head[pv=fp8,dtype=fp16]" in {r.variant for r in run.rows}
