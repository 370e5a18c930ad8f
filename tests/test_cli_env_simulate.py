"""`sagevideo env` and `sagevideo simulate` through the CLI."""

import json
import re

import pytest
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


def test_simulate_prints_table_summary_and_json(tmp_path):
    out = tmp_path / "sim.json"
    result = runner.invoke(
        app, ["simulate", "--shape", "1,2,128,64", "--pv", "fp16", "--smooth-k", "both", "--rotate", "off",
              "--json", str(out)],
    )
    assert result.exit_code == 0, result.output
    assert "cos worst" in result.output and "smooth_k=off" in result.output and "smooth_k=on" in result.output
    assert "sagevideo simulate: 2 variants; worst cosine" in result.output
    assert "simulate:" in result.stderr and "fp64 reference: k-offset" in result.stderr  # progress, on stderr
    figures = json.loads(out.read_text())
    assert len(figures) == 2 and {"cos_worst", "rel_l1_worst", "rmse_worst"} <= figures[0].keys()


def test_simulate_bad_input_is_exit_2():
    assert runner.invoke(app, ["simulate", "--shape", "1,2,3"]).exit_code == 2
    result = runner.invoke(app, ["simulate", "--qkv", "/nonexistent.safetensors"])
    assert result.exit_code == 2 and "no such file" in result.output


def test_simulate_refuses_what_it_could_only_find_out_after_computing(tmp_path, monkeypatch):
    import sagevideo.eval.numerics.simulate as simulate_module

    monkeypatch.setattr(simulate_module, "simulate", lambda *a, **k: pytest.fail("computed before refusing"))
    not_tensors = tmp_path / "captured.safetensors"
    not_tensors.write_text("q, k and v, as text\n")
    cases = [
        (["--qkv", str(not_tensors)], f"--qkv {not_tensors}: not a readable safetensors file"),
        (["--json", str(tmp_path / "no" / "figures.json")], f"--json {tmp_path / 'no' / 'figures.json'}: folder"),
        (["--json", str(tmp_path)], f"--json {tmp_path}: is a folder"),
        # 1·64·131072² fp64 scores alone are 8.8 TB: refused with the estimate and a shape that fits
        (["--shape", "1,64,131072,128"], "needs about"),
    ]
    for args, message in cases:
        result = runner.invoke(app, ["simulate", *args])
        assert result.exit_code == 2, (args, result.output)
        (line,) = result.stderr.splitlines()
        assert line.startswith(f"sagevideo simulate: error: {message}"), (args, line)
    assert "available; use fewer tokens or heads, e.g. --shape 1,64," in line
