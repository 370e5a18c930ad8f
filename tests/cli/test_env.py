"""`sagevideo env` through the CLI: versions, devices, the kernel plan per device, the sm90 kernel choice."""

import re

from typer.testing import CliRunner

from sagevideo.cli.app import app

runner = CliRunner()


def test_env_lists_versions_devices_and_plans():
    result = runner.invoke(app, ["env"])
    assert result.exit_code == 0, result.output
    assert "torch" in result.output and "triton" in result.output
    assert "kernel plan per device" in result.output
    assert "d64" in result.output and "d128" in result.output
    assert "pv=fp8" in result.output


def test_env_says_which_kernel_runs_on_hopper(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H200")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.delenv("SAGEVIDEO_SM90_KERNEL", raising=False)
    from sagevideo.kernels import plans

    monkeypatch.setattr(plans, "gluon_sm90_compile_problem", lambda block_d, stages: "")  # no interpreter here
    output = runner.invoke(app, ["env"]).output
    runs = {(d, pv): kernel for d, pv, kernel in re.findall(r"cuda:0\s+(d\d+)\s+pv=(\w+)\s+->\s+(\S+)", output)}
    assert runs == {("d64", "fp16"): "triton", ("d64", "fp8"): "triton", ("d128", "fp16"): "triton",
                    ("d128", "fp8"): "gluon"}
    assert "SAGEVIDEO_SM90_KERNEL=auto" in output
    monkeypatch.setenv("SAGEVIDEO_SM90_KERNEL", "triton")
    output = runner.invoke(app, ["env"]).output
    assert set(re.findall(r"cuda:0\s+d\d+\s+pv=\w+\s+->\s+(\S+)", output)) == {"triton"}


def test_env_refuses_a_misspelt_kernel_choice(monkeypatch):
    monkeypatch.setenv("SAGEVIDEO_SM90_KERNEL", "glun")
    result = runner.invoke(app, ["env"])
    assert result.exit_code == 2
    assert "sagevideo env: error: SAGEVIDEO_SM90_KERNEL='glun': use one of ('auto', 'triton', 'gluon')" in result.output
