"""`python -m sagevideo.generation.torchrun`: the same sequence-parallel pieces under plain torchrun, without Ray."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sagevideo.generation import torchrun as launcher
from tests.helpers.sp_tolerance import JOBS, assert_same_videos

ROOT = Path(__file__).resolve().parents[2]


def test_a_degree_the_jobs_cannot_take_stops_every_rank_before_loading(tmp_path, monkeypatch, capsys):
    import sagevideo.pipelines.loading as loading

    monkeypatch.setattr(loading, "load_pipeline", lambda *a, **k: pytest.fail("model loaded"))
    monkeypatch.setenv("WORLD_SIZE", "2")
    args = ["--out", str(tmp_path / "out"), "-p", "a cat", "--height", "48", "--width", "48", "--device", "cpu"]
    monkeypatch.setenv("RANK", "0")
    assert launcher.main(args) == 2
    error = ("sagevideo torchrun: error: job 1: --gpus-per-job 2: 253 tokens (226 text + 27 video) are not "
             "divisible by 2")
    assert error in capsys.readouterr().err
    monkeypatch.setenv("RANK", "1")  # the other ranks stop as well, silently
    assert launcher.main(args) == 2 and capsys.readouterr().err == ""


def test_a_job_files_step_cache_is_refused_for_several_ranks_before_loading(tmp_path, no_model_load, monkeypatch,
                                                                             capsys):
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text("recipe:\n  cache: first-block\njobs:\n  - a cat\n")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    assert launcher.main([str(jobs), "--out", str(tmp_path / "out"), "--device", "cpu"]) == 2
    error = "--cache first-block: step caching with --gpus-per-job 2 would let each rank decide"
    assert error in capsys.readouterr().err


@pytest.mark.slow
def test_torchrun_two_ranks_match_one_process(tmp_path):
    import sagevideo

    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(JOBS)
    sagevideo.generate(jobs, out=tmp_path / "one", device="cpu", progress=False)
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    args = ["-m", "sagevideo.generation.torchrun", str(jobs), "--out", str(tmp_path / "sp"), "--device", "cpu",
            "--no-progress"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([*torchrun, *args], capture_output=True, text=True, timeout=240, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "3 done, 0 skipped, 0 failed" in done.stdout and "2 ranks; rank 0 decodes and writes" in done.stderr
    records = [json.loads(line) for line in (tmp_path / "sp" / "manifest.jsonl").read_text().splitlines()]
    assert len(records) == 3 and {r["status"] for r in records} == {"done"}  # one writer: rank 0
    assert sorted(os.listdir(tmp_path / "sp")) == ["full.mp4", "killed.mp4", "manifest.jsonl", "sage.mp4"]
    assert_same_videos(tmp_path / "sp", tmp_path / "one")


def test_the_options_are_generates_with_their_spelling_and_the_recipe_image_and_negative_prompt(tmp_path):
    """One declaration: torchrun reads `GenerateConfig`'s fields as generate spells them."""
    from sagevideo.jobs.config import GenerateConfig

    image = tmp_path / "first.png"
    config = launcher.parse_config([
        "shots.yaml", "-o", str(tmp_path), "-p", "a cat", "--prompt", "a dog", "--negative-prompt", "blurry",
        "--image", str(image), "--linear", "fp8", "--linear-bf16-steps", "0", "-1", "--cache", "first-block",
        "--cache-threshold", "0.1", "--steps", "3", "--guidance", "4.5", "--no-progress", "--frames-png",
        "--attention-guard", "fail",
    ])
    expected = GenerateConfig.build(
        ["a cat", "a dog"], job_file="shots.yaml", out=tmp_path, negative_prompt="blurry", image=image, linear="fp8",
        linear_bf16_steps=[0, -1], cache="first-block", cache_threshold=0.1, steps=3, guidance=4.5, progress=False,
        frames_png=True, attention_guard="fail", workers=1,
    )
    assert config == expected and config.problems == []
    assert launcher.parse_config(["--out", str(tmp_path)]) == GenerateConfig.build(out=tmp_path, workers=1)


def test_every_generate_option_is_a_torchrun_option_but_those_the_ranks_decide():
    from sagevideo.jobs.config import COMMAND_LINE, GenerateConfig

    actions = {action.dest: action for action in launcher.command_line()._actions if action.dest != "help"}
    assert set(actions) == set(GenerateConfig.model_fields) - set(launcher.TORCHRUN_LEAVES_OUT)
    for name, action in actions.items():
        assert action.help == GenerateConfig.model_fields[name].description.replace("%", "%%"), name
        flags = [flag.split("/")[0] for flag in COMMAND_LINE.get(name, {}).get("flags", ())]
        assert set(flags) <= set(action.option_strings), name
    assert actions["progress"].option_strings == ["--progress", "--no-progress"]


def test_bad_options_exit_with_the_projects_codes(tmp_path, monkeypatch, capsys, no_model_load):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert launcher.main(["--out", str(tmp_path), "--gpus-per-job", "2"]) == 2  # the ranks are torchrun's
    assert "unrecognized arguments: --gpus-per-job" in capsys.readouterr().err
    assert launcher.main(["--out", str(tmp_path), "--steps", "0", "--device", "cpu"]) == 2  # planned, as generate
    assert "--steps 0" in capsys.readouterr().err
    assert launcher.main(["--help"]) == 0
