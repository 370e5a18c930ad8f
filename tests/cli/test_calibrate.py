"""`sagevideo calibrate` on the command line: the plan and Q/K/V files it writes, its summary and
progress, and bad input refused with exit 2 before anything loads."""

import pytest
from typer.testing import CliRunner

from sagevideo.cli.app import app
from sagevideo.pipelines.plans import AttentionPlan


def test_cli_writes_plan_and_qkv(tmp_path):
    plan_path, qkv = tmp_path / "plan.json", tmp_path / "qkv.safetensors"
    result = CliRunner().invoke(
        app, ["calibrate", "--out", str(plan_path), "--capture-steps", "-1", "--prompt", "a fox",
              "--save-qkv", str(qkv)],
    )
    assert result.exit_code == 0, result.output
    assert "sagevideo calibrate: 2 layers" in result.output and "worst layer transformer_blocks." in result.output
    assert "calibrate: 100%" in result.stderr and "measuring transformer_blocks.1.attn1 (step 1)" in result.stderr
    plan = AttentionPlan.load(plan_path)
    assert plan.num_steps == 2 and len(plan.layers) == 2
    from sagevideo.eval.numerics.simulate import load_qkv_file

    assert set(load_qkv_file(qkv)) == {f"transformer_blocks.{i}.attn1.step1" for i in (0, 1)}


@pytest.mark.parametrize(
    "args, match",
    [
        (["--capture-steps", "5"], "outside the run's 2 steps"),
        (["--capture-steps", "x"], "give integers"),
        (["--threshold", "1.5"], "threshold"),
        (["--model", "/nonexistent/model"], "nonexistent"),
        (["--device", "cpu", "--linear", "fp8"], "--linear fp8: float8 linears need a CUDA GPU"),
        (["--cache", "first-block"], "--cache first-block: calibration measures each layer's attention"),
    ],
)
def test_cli_bad_input_is_exit_2(tmp_path, args, match):
    result = CliRunner().invoke(app, ["calibrate", "--out", str(tmp_path / "p.json"), *args])
    assert result.exit_code == 2, result.output
    assert match in result.output


def test_cli_refuses_unusable_outputs_and_prompt_files_before_loading(tmp_path, monkeypatch):
    from sagevideo.pipelines import loading

    monkeypatch.setattr(loading, "load_pipeline", lambda *a, **k: pytest.fail("a model was loaded for bad input"))
    import sagevideo.generation.budget

    monkeypatch.setattr(sagevideo.generation.budget, "available_bytes", lambda device="cpu": 24 * 10**9)
    (tmp_path / "plans").mkdir()
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes("un caf\xe9\n".encode("latin-1"))
    comments = tmp_path / "comments.txt"
    comments.write_text("# nothing yet\n\n")
    plan = str(tmp_path / "p.json")
    cases = [
        (["--out", str(tmp_path / "plans")], f"--out {tmp_path / 'plans'}: is a folder; give a file name"),
        (["--out", str(tmp_path / "no" / "p.json")], f"folder {tmp_path / 'no'} does not exist"),
        (["--out", plan, "--save-qkv", str(tmp_path / "plans")], "--save-qkv"),
        ([str(latin1), "--out", plan], f"prompts file {latin1} is not UTF-8 text"),
        ([str(comments), "--out", plan], f"prompts file {comments} has no prompts"),  # not the built-in ones
        (["--out", plan, "--steps", "0"], "--steps 0: Input should be greater than or equal to 1"),
        (["--out", plan, "--width", "8192", "--height", "8192", "--frames", "49"],
         "calibrating at 8192x8192, 49 frames needs about 126 GB (3,408,098 tokens per attention call), but the cpu "
         "has 24.0 GB free"),
    ]
    for args, message in cases:
        result = CliRunner().invoke(app, ["calibrate", *args])
        assert result.exit_code == 2, (args, result.output)
        (line,) = result.stderr.splitlines()
        assert line.startswith("sagevideo calibrate: error: ") and message in line, (args, line)


def test_cli_calibrates_under_a_recipe_and_says_so(tmp_path):
    plan_path = tmp_path / "plan.json"
    result = CliRunner().invoke(app, ["calibrate", "--out", str(plan_path), "--capture-steps", "-1", "-p", "a fox",
                                      "--no-progress", "--compile", "regional", "--compile-backend", "eager"])
    assert result.exit_code == 0, result.output
    assert "sagevideo calibrate: measured with --linear bf16 (the plan's recipe); --compile regional " \
           "--compile-backend eager was not applied" in result.output
    assert AttentionPlan.load(plan_path).recipe["compile"] == "none"
