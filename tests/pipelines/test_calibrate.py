"""Calibration on the tiny CogVideoX: errors per layer and mode, the plan it writes, the CLI."""

import pytest
import torch
from typer.testing import CliRunner

from sagevideo.cli.app import app
from sagevideo.pipelines.calibrate import CANDIDATES, calibrate_pipeline
from sagevideo.pipelines.plans import AttentionPlan, Mode


def _run(pipe):
    pipe("a red panda", num_frames=9, num_inference_steps=2, generator=torch.Generator().manual_seed(0),
         output_type="latent", max_sequence_length=32)


def test_calibration_measures_every_layer_and_mode(tiny_pipe):
    result = calibrate_pipeline(tiny_pipe, _run, threshold=0.999, num_steps=2)
    layers = [k.removesuffix(".processor") for k in tiny_pipe.transformer.attn_processors]
    assert list(result.errors) == layers
    for errs in result.errors.values():
        assert set(errs) == {c.label for c in CANDIDATES}
        assert all(w.calls == 2 and 0.99 < w.cos <= 1.0 for w in errs.values())  # 2 steps captured
        # 16-bit PV is more accurate than FP8 PV on the same inputs
        assert errs["int8-fp16/block"].cos > errs["int8-fp8/block"].cos
    assert result.plan.default.label == "int8-fp8/block"  # fastest mode meets 0.999 here
    name, worst = result.worst_layer()
    assert name in layers and worst.cos == min(e["int8-fp8/block"].cos for e in result.errors.values())
    assert name in result.table()
    assert "set_timesteps" not in vars(tiny_pipe.scheduler)  # probe removed


def test_threshold_decides_mode_and_full_precision_fallback(tiny_pipe):
    strict = calibrate_pipeline(tiny_pipe, _run, threshold=1.0, num_steps=2)
    assert strict.plan.default.mode is Mode.full  # nothing is exact: every layer keeps full precision
    middle = calibrate_pipeline(tiny_pipe, _run, threshold=0.9999, num_steps=2)
    assert {c.mode for c in middle.chosen.values()} <= {Mode.int8_fp16}
    # the written plan is valid for the model and round-trips
    again = AttentionPlan.from_json(middle.plan.to_json())
    assert again == middle.plan
    again.validate_for(list(middle.errors), num_steps=2)


def test_capture_steps_limit_what_is_measured(tiny_pipe):
    result = calibrate_pipeline(tiny_pipe, _run, capture_steps={1}, num_steps=2)
    assert all(w.calls == 1 and w.step == 1 for errs in result.errors.values() for w in errs.values())
    with pytest.raises(RuntimeError, match="captured no attention call"):
        calibrate_pipeline(tiny_pipe, _run, capture_steps={7}, num_steps=2)


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
    ],
)
def test_cli_bad_input_is_exit_2(tmp_path, args, match):
    result = CliRunner().invoke(app, ["calibrate", "--out", str(tmp_path / "p.json"), *args])
    assert result.exit_code == 2, result.output
    assert match in result.output


def test_a_peaky_layer_is_flagged_by_name_and_kept_in_full_precision(tiny_pipe):
    """Attention past INT8's resolution (q, k x30: every mode near cosine 0.97) is named, with its
    score std, and kept in full precision; the other layers keep their quantized modes."""
    block = tiny_pipe.transformer.transformer_blocks[0].attn1
    scaled = [t for t in (block.norm_q.weight, block.norm_k.weight) if t is not None] if block.norm_q is not None \
        else [block.to_q.weight, block.to_k.weight]
    saved = [t.detach().clone() for t in scaled]
    try:
        with torch.no_grad():
            for t in scaled:
                t.mul_(30.0)
        result = calibrate_pipeline(tiny_pipe, _run, threshold=0.999, num_steps=2)
    finally:
        with torch.no_grad():
            for t, s in zip(scaled, saved, strict=True):
                t.copy_(s)
    peaky = "transformer_blocks.0.attn1"
    assert list(result.peaky) == [peaky] and "peaky attention: score std" in result.peaky[peaky]
    assert result.chosen[peaky].mode is Mode.full
    assert result.score_std[peaky] > 10 * max(v for k, v in result.score_std.items() if k != peaky)
    assert all(c.mode is not Mode.full for name, c in result.chosen.items() if name != peaky)
    assert peaky in result.peaky_note() and "(peaky)" in result.table()


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
