"""sagevideo/attention/environment.py: devices, backends and the kernel each device runs (a CPU-only
machine here; Hopper is simulated in tests/cli/test_env.py)."""

import torch

from sagevideo.attention import environment


def test_on_cpu_every_plan_row_falls_back_to_sdpa_with_its_reason(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # set for the tests' CPU kernels
    assert environment.devices() == [torch.device("cpu")]
    rows = environment.plan_rows()
    assert {(r.head_dim, r.pv) for r in rows} == {(64, "fp16"), (64, "fp8"), (128, "fp16"), (128, "fp8")}
    assert all(r.runs == "sdpa (fallback)" and r.detail for r in rows)


def test_the_attention_lines_name_every_backend_on_every_device(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    lines = environment.attention_lines()
    assert lines[:2] == ["devices:", f"  {environment.device_name(torch.device('cpu'))}"]
    backends = {r.backend for r in environment.backend_rows()}
    assert backends >= {"triton", "reference", "sdpa"}
    assert all(any(line.strip().startswith(name) for line in lines) for name in backends)


def test_under_the_interpreter_the_cpu_rows_name_the_kernel_and_its_plan(monkeypatch):
    from sagevideo.kernels.dispatch import kernel_for

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    for row in environment.plan_rows():
        choice = kernel_for(torch.device("cpu"), row.head_dim, row.pv)
        assert (row.runs, row.detail) == (choice.kernel, choice.plan.describe())
