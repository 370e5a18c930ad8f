"""`sagevideo simulate` through the CLI: the table, the JSON, and bad input refused with exit 2."""

import json

import pytest
from typer.testing import CliRunner

from sagevideo.cli.app import app

runner = CliRunner()


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


def test_bad_values_name_the_option_and_exit_2(tmp_path):
    from typer.testing import CliRunner

    result = CliRunner().invoke(app, ["simulate", "--shape", "1,2,3"])
    assert result.exit_code == 2
    assert "sagevideo simulate: error: --shape 1,2,3: give B,H,N,D as four positive integers" in result.stderr
