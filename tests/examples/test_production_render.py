"""examples/production_render.py and its example shot list."""

import importlib.util
import json
from pathlib import Path

import pytest

from sagevideo.generation.generate import plan_batch

ROOT = Path(__file__).resolve().parents[2]
SHOTS = ROOT / "examples" / "shots.yaml"


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("production_render", ROOT / "examples" / "production_render.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_example_shot_list_is_valid_at_full_size(tmp_path):
    plan = plan_batch(job_file=SHOTS, out=tmp_path)
    assert [pj.output for pj in plan.jobs] == [
        "ep01-sh010-forest-dawn.mp4", "ep01-sh020-red-panda.mp4", "ep01-sh030-river.mp4", "ep01-sh040-hero-closeup.mp4"
    ]
    assert [(pj.job.width, pj.job.height, pj.job.frames) for pj in plan.jobs][2] == (720, 480, 81)
    assert plan.jobs[3].backend is None and plan.jobs[0].job.pv == "fp8"


@pytest.mark.slow
def test_preview_render_and_summary(tmp_path, script, capsys):
    assert script.main([str(SHOTS), "--model", "tiny", "--out", str(tmp_path), "--preview", "--no-progress"]) == 0
    shown = capsys.readouterr().out
    assert "production_render: 4/4 shots done" in shown and "ep01-sh040-hero-closeup.mp4" in shown
    records = [json.loads(line) for line in (tmp_path / "preview" / "manifest.jsonl").read_text().splitlines()]
    assert [(r["width"], r["height"], r["frames"], r["steps"]) for r in records] == [(64, 64, 9, 2)] * 4


def test_bad_shot_list_exits_2_naming_the_line(tmp_path, script, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("jobs:\n  - prompt: a\n    resolution: 720x481\n")
    assert script.main([str(bad), "--model", "tiny", "--out", str(tmp_path / "out")]) == 2
    assert "bad.yaml line 3 (job 1): height: 481 px is not a multiple of 16" in capsys.readouterr().err


def test_bad_shot_list_exits_2_in_preview_too_with_every_problem(tmp_path, script, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("jobs:\n  - prompt: a\n    steps: -2\n    resolution: 720x481\n")
    assert script.main([str(bad), "--model", "tiny", "--out", str(tmp_path / "out"), "--preview"]) == 2
    err = capsys.readouterr().err
    assert "bad.yaml line 3 (job 1): steps: Input should be greater than or equal to 1" in err
    assert "Traceback" not in err
    # checked as written: the preview's own 64x64 would have hidden the bad size
    bad.write_text("jobs:\n  - prompt: a\n    resolution: 720x481\n")
    assert script.main([str(bad), "--model", "tiny", "--out", str(tmp_path / "out"), "--preview"]) == 2
    assert "bad.yaml line 3 (job 1): height: 481 px is not a multiple of 16" in capsys.readouterr().err


def test_a_preview_runs_the_shot_lists_recipe(tmp_path, script):
    shots = tmp_path / "shots.yaml"
    shots.write_text("recipe:\n  cache: first-block\n  cache_threshold: 5.0\njobs:\n  - prompt: a lighthouse\n")
    assert script.main([str(shots), "--model", "tiny", "--out", str(tmp_path / "out"), "--preview",
                        "--no-progress"]) == 0
    manifest = tmp_path / "out" / "preview" / "manifest.jsonl"
    (record,) = [json.loads(line) for line in manifest.read_text().splitlines()]
    assert record["recipe"]["cache"] == "first-block" and record["recipe"]["cache_skipped"] == 1  # 2 steps


def test_preview_help_says_where_it_writes(script, capsys):
    with pytest.raises(SystemExit):
        script.main(["--help"])
    assert "into OUT/preview/" in " ".join(capsys.readouterr().out.split())
