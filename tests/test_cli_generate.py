"""`sagevideo generate` through typer's CliRunner: exit codes, messages, summary line."""

import json
import subprocess
import sys

import imageio.v2 as imageio
import pytest
from typer.testing import CliRunner

from sagevideo.cli.app import app

runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, ["generate", *map(str, args)])


def test_generate_writes_videos_and_prints_summary(tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("# two prompts\na red panda\n\nwaves at sunset\n")
    out = tmp_path / "out"
    result = invoke(prompts, "--out", out, "--prompt", "a third one", "--no-progress")
    assert result.exit_code == 0, result.output
    assert "quantization emulation (reference/fp16)" in result.stderr
    assert result.stdout.strip() == (
        f"sagevideo: 3 done, 0 skipped, 0 failed → {out} (manifest.jsonl); attention: reference/fp16 x12"
    )
    records = [json.loads(line) for line in (out / "manifest.jsonl").read_text().splitlines()]
    assert [r["prompt"] for r in records] == ["a red panda", "waves at sunset", "a third one"]
    assert len(list(out.glob("*.mp4"))) == 3

    again = invoke(prompts, "--out", out, "--prompt", "a third one", "--no-progress")
    assert again.exit_code == 0 and "0 done, 3 skipped, 0 failed" in again.stdout


def test_options_reach_the_jobs(tmp_path):
    out = tmp_path / "out"
    result = invoke(
        "--out",
        out,
        "-p",
        "x",
        "--seed",
        5,
        "--frames",
        17,
        "--height",
        32,
        "--width",
        48,
        "--steps",
        1,
        "--guidance",
        1.0,
        "--pv",
        "fp8",
        "--fps",
        4,
        "--no-progress",
    )
    assert result.exit_code == 0, result.output
    (r,) = [json.loads(line) for line in (out / "manifest.jsonl").read_text().splitlines()]
    assert (
        r["seed"],
        r["frames"],
        r["height"],
        r["width"],
        r["steps"],
        r["guidance"],
        r["pv"],
        r["fps"],
    ) == (5, 17, 32, 48, 1, 1.0, "fp8", 4)
    assert r["backends"]["counts"] == {"reference/fp8": 2}  # no CFG at guidance 1: one pass per step
    with imageio.get_reader(out / r["outputs"][0]) as reader:  # the file has what the record says
        assert sum(1 for _ in reader) == 17


def test_failed_job_gives_exit_code_1(tmp_path, monkeypatch):
    import sagevideo.pipelines.runner as runner_module

    real = runner_module.run_job
    monkeypatch.setattr(
        runner_module,
        "run_job",
        lambda pipe, job, **kw: (
            (_ for _ in ()).throw(RuntimeError("boom")) if job.prompt == "bad" else real(pipe, job, **kw)
        ),
    )
    result = invoke("--out", tmp_path, "-p", "bad", "-p", "good", "--no-progress")
    assert result.exit_code == 1
    assert "failed: RuntimeError: boom" in result.stderr
    assert "1 done, 0 skipped, 1 failed" in result.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (["missing.txt"], "prompts file missing.txt does not exist"),
        (["--model", "/no/such/folder"], "--model /no/such/folder: no such folder"),
        (["--frames", "8"], "--frames 8: 8 is not 1 + a multiple of 4"),  # the option, not "job 1: frames:"
        (["--backend", "triton", "--device", "cpu"], "--backend triton cannot run"),
        (["--job-timeout", "0"], "--job-timeout 0.0: give seconds > 0"),
    ],
)
def test_bad_input_exits_2_with_one_clear_line(tmp_path, monkeypatch, args, message):
    import sagevideo.pipelines.loading as loading

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(loading, "load_pipeline", lambda *a, **k: pytest.fail("model loaded"))
    result = invoke(*args, "--out", tmp_path / "out")
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("sagevideo generate: error: ") and message in lines[0]


def test_out_is_a_file(tmp_path):
    blocker = tmp_path / "f"
    blocker.write_text("x")
    result = invoke("--out", blocker / "sub")
    assert result.exit_code == 2 and "cannot write there" in result.stderr


def test_help_and_missing_out():
    assert "--out" in runner.invoke(app, ["generate", "--help"]).stdout
    result = invoke()
    assert result.exit_code == 2 and "--out" in result.output


def test_imports_stay_light():
    """`import sagevideo`, the CLI module and the generation/scheduling modules load neither diffusers,
    triton nor ray (Ray is imported only when a batch runs on it)."""
    code = (
        "import sys, sagevideo, sagevideo.cli.app, sagevideo.jobs.specs, sagevideo.jobs.files, "
        "sagevideo.generation.generate, sagevideo.scheduling; "
        "print([m for m in ('diffusers', 'transformers', 'triton', 'ray', 'torch') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_python_dash_m_runs_the_cli():
    done = subprocess.run([sys.executable, "-m", "sagevideo", "generate", "--help"], capture_output=True, text=True)
    assert done.returncode == 0 and "Usage: sagevideo generate" in done.stdout and "--job-timeout" in done.stdout


def test_model_that_cannot_load_exits_1(tmp_path, monkeypatch):
    import sagevideo.pipelines.loading as loading

    def broken(*args, **kwargs):
        raise OSError("header too large")  # e.g. a corrupt safetensors file

    monkeypatch.setattr(loading, "load_pipeline", broken)
    result = invoke("--out", tmp_path, "--no-progress")
    assert result.exit_code == 1
    assert "error: could not load model tiny: OSError: header too large" in result.stderr
    assert not (tmp_path / "manifest.jsonl").exists()


def test_a_mistyped_manifest_line_is_said_once_and_the_batch_resumes(tmp_path):
    out = tmp_path / "out"
    first = invoke("--out", out, "-p", "a fox", "--no-progress")
    assert first.exit_code == 0, first.output
    manifest = out / "manifest.jsonl"
    with manifest.open("a") as f:  # valid JSON, wrong types: a hand edit or another tool's line
        f.write('{"job_id": "0123", "status": "done", "outputs": 5}\n{"job_id": "b", "sta')
    again = invoke("--out", out, "-p", "a fox", "--no-progress")
    assert again.exit_code == 0, again.output
    assert "0 done, 1 skipped" in again.stdout
    said = [line for line in again.stderr.splitlines() if "not a usable record" in line]
    assert len(said) == 2 and said[0].startswith("sagevideo: manifest.jsonl line 2 is not a usable record (field "
                                                 "outputs: Input should be a valid list (got 5))")
    assert "Traceback" not in again.output and "Warning" not in again.output
    third = invoke("--out", out, "-p", "a fox", "--no-progress")
    assert third.exit_code == 0 and "not a usable record" not in third.stderr
