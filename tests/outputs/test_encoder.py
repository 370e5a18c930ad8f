"""No video encoder: every command that writes or reads videos refuses at once (exit 2, one line
naming the fix), before any model loads; nothing is rendered only to fail at the write."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from sagevideo.cli.app import app
from sagevideo.outputs.encoder import encoder_problem

runner = CliRunner()
FIX = "set IMAGEIO_FFMPEG_EXE to an ffmpeg binary, or unset it to use imageio-ffmpeg's own"


@pytest.fixture
def no_loads(monkeypatch):
    """Loading a pipeline or a metric model fails the test."""
    from sagevideo.eval import clip_metrics
    from sagevideo.pipelines import loading

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded although no video could be written")

    monkeypatch.setattr(loading, "load_pipeline", refuse)
    monkeypatch.setattr(clip_metrics, "load_clip", refuse)


def not_executable(tmp_path):
    path = tmp_path / "ffmpeg"
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(0o644)
    return path


def not_ffmpeg(tmp_path):
    """Runs and exits 0, but lists no encoder at all (a wrapper, a stub, an ffmpeg built without x264)."""
    path = tmp_path / "ffmpeg"
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(0o755)
    return path


@pytest.mark.parametrize(
    "make, says",
    [
        (lambda tmp: tmp / "nothing-here", "no such file"),
        (lambda tmp: tmp, "is a folder"),
        (not_executable, "is not executable (chmod +x "),
        (not_ffmpeg, "lists no libx264 encoder"),
    ],
)
def test_an_encoder_variable_that_names_no_usable_ffmpeg_is_one_line(tmp_path, monkeypatch, make, says):
    exe = make(tmp_path)
    monkeypatch.setenv("IMAGEIO_FFMPEG_EXE", str(exe))
    problem = encoder_problem()
    assert problem.startswith(f"IMAGEIO_FFMPEG_EXE={exe}: ") and says in problem and problem.endswith(FIX)
    assert "\n" not in problem


def test_the_bundled_encoder_missing_says_to_reinstall(tmp_path, monkeypatch):
    import imageio_ffmpeg
    import imageio_ffmpeg._utils as utils

    def none_found():
        raise RuntimeError("No ffmpeg exe could be found.")

    monkeypatch.delenv("IMAGEIO_FFMPEG_EXE", raising=False)
    monkeypatch.setattr(imageio_ffmpeg, "get_ffmpeg_exe", none_found)
    monkeypatch.setattr(utils, "_get_bin_dir", lambda: str(tmp_path))  # an emptied binaries/ folder
    problem = encoder_problem()
    assert problem.startswith(f"no video encoder: imageio-ffmpeg's ffmpeg binary is missing ({tmp_path}")
    assert "pip install --force-reinstall imageio-ffmpeg" in problem and "IMAGEIO_FFMPEG_EXE" in problem


def test_the_bundled_encoder_is_fine():
    assert encoder_problem() is None


def one_error_line(result, command):
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"sagevideo {command}: error: "), result.output
    assert "Traceback" not in result.output
    return lines[0]


def test_generate_refuses_before_loading(tmp_path, monkeypatch, no_loads):
    monkeypatch.setenv("IMAGEIO_FFMPEG_EXE", str(tmp_path / "nothing-here"))
    result = runner.invoke(app, ["generate", "-p", "a fox", "--out", str(tmp_path / "out"), "--no-progress"])
    line = one_error_line(result, "generate")
    assert f"IMAGEIO_FFMPEG_EXE={tmp_path / 'nothing-here'}: no such file" in line and line.endswith(FIX)
    assert not (tmp_path / "out" / "manifest.jsonl").exists()


def test_ab_refuses_before_any_arm(tmp_path, monkeypatch, no_loads):
    jobs = tmp_path / "jobs.txt"
    jobs.write_text("a fox\n")
    monkeypatch.setenv("IMAGEIO_FFMPEG_EXE", str(not_executable(tmp_path)))
    result = runner.invoke(app, ["ab", str(jobs), "--out", str(tmp_path / "ab"), "--no-progress"])
    assert "is not executable" in one_error_line(result, "ab")
    assert not (tmp_path / "ab").exists()


def test_eval_refuses_instead_of_calling_the_videos_truncated(arms, tmp_path, monkeypatch, no_loads):
    monkeypatch.setenv("IMAGEIO_FFMPEG_EXE", str(tmp_path / "nothing-here"))
    result = runner.invoke(app, ["eval", str(arms["ref"]), str(arms["same"]), "--out", str(tmp_path / "o"),
                                 "--metrics", "psnr"])
    line = one_error_line(result, "eval")
    assert "IMAGEIO_FFMPEG_EXE" in line and "no such file" in line and "truncated" not in line
