"""bench/edge_cases.py's --append-results on CPU: each case's subprocess replaced by its recorded output."""

import json
import subprocess

from bench import edge_cases
from bench.results import load, one

CASES = {
    "large": [{"case": "q,k x1000 d64", "pv": "fp8", "ran": "triton/fp8", "nonfinite": 0}],
    "nan-row": [{"case": "one NaN in q, d64", "pv": "fp16", "ran": "triton/fp16", "nonfinite_rows": 1,
                 "sdpa_nonfinite_rows": 1}],
    "peaky": [{"case": "peaky q x1000", "pv": "fp8", "ran": "triton/fp8", "cos_worst": 0.99871}],
}


def test_cases_become_rows_and_a_crashed_case_an_error_row(monkeypatch, tmp_path, capsys):
    def fake_run(args, **kwargs):
        case = args[args.index("--one") + 1]
        if case == "2^31-gluon":  # the CUDA context died: no JSON line, the error on stderr
            return subprocess.CompletedProcess(args, 1, "", "RuntimeError: CUDA error: an illegal memory access\n")
        return subprocess.CompletedProcess(args, 0, json.dumps(CASES[case]) + "\n", "")

    monkeypatch.setattr(edge_cases.subprocess, "run", fake_run)
    monkeypatch.setattr("torch.cuda.get_device_name", lambda *a: "NVIDIA H200")
    monkeypatch.setenv("BENCH_COMMIT", "abc1234")
    path = tmp_path / "results.jsonl"
    assert edge_cases.main(["--cases", "large,nan-row,peaky,2^31-gluon", "--append-results", str(path)]) == 0
    assert "5 rows appended" in capsys.readouterr().out
    rows = load(path)
    assert {(r.bench, r.gpu, r.commit) for r in rows} == {("edge_cases", "NVIDIA H200", "abc1234")}
    large = one(rows, shape="q,k x1000 d64", variant="sagevideo[pv=fp8]", metric="nonfinite")
    assert (large.value, large.unit, large.extra) == (0, "count", {"ran": "triton/fp8"})
    assert one(rows, shape="one NaN in q, d64", metric="sdpa_nonfinite_rows").value == 1
    assert one(rows, shape="peaky q x1000", metric="cos_worst").value == 0.99871
    crashed = one(rows, shape="2^31-gluon", metric="error")
    assert crashed.variant == "sagevideo[pv=fp8]" and "illegal memory access" in crashed.extra["error"]
