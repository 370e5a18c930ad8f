"""eval/results.py: what an evaluation says it could not write, and the versions it records."""

from pathlib import Path

from sagevideo.eval.results import describe_write_error, not_written_line, versions


def test_files_not_written_are_grouped_by_reason_with_the_difference_videos_counted(tmp_path):
    not_written = {f"videos/{i:03d}-diff.mp4": "disk full (ENOSPC)" for i in range(4)}
    not_written["report.html"] = "disk full (ENOSPC)"
    line = not_written_line(tmp_path, not_written, ["metrics.json"])
    assert line.startswith(f"{tmp_path}: disk full (ENOSPC): report.html, the 4 difference videos "
                           "videos/000-diff.mp4 to 003-diff.mp4 not written")
    assert f"the metrics are in {Path(tmp_path) / 'metrics.json'}" in line
    assert "no metrics.json was written" in not_written_line(tmp_path, {"metrics.json": "no"}, [])


def test_versions_name_sagevideo_python_and_the_installed_packages_only():
    found = versions()
    assert {"sagevideo", "python", "platform", "torch", "numpy"} <= set(found)
    assert all(isinstance(v, str) for v in found.values())


def test_a_write_error_is_said_without_the_file_name_twice():
    from sagevideo.outputs.video import VideoWriteError

    assert describe_write_error(VideoWriteError("a.mp4 not written: ffmpeg failed")) == "ffmpeg failed"
    assert describe_write_error(ValueError("odd")) == "odd"
