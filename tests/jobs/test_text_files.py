"""jobs/text_files.py: reading a user's text files, and a prompts file that is not a job file."""

import pytest

from sagevideo.errors import InputError
from sagevideo.jobs.text_files import read_prompts_file, read_text_file


def test_prompts_are_lines_with_their_place_blank_and_comment_lines_skipped(tmp_path):
    path = tmp_path / "prompts.txt"
    path.write_text("# shots\na fox\n\n  a lighthouse at dusk  \n", encoding="utf-8")
    assert read_prompts_file(path) == [("a fox", f"{path} line 2"), ("a lighthouse at dusk", f"{path} line 4")]


def test_a_job_file_under_another_name_is_refused_not_read_as_prompts(tmp_path):
    path = tmp_path / "shots.txt"
    path.write_text("jobs:\n  - prompt: a fox\n", encoding="utf-8")
    with pytest.raises(InputError, match=r"shots.txt line 1: looks like a YAML/TOML job file"):
        read_prompts_file(path)


def test_unreadable_files_say_what_they_are_and_why(tmp_path):
    with pytest.raises(InputError, match=r"^prompts file .*missing.txt does not exist; give a text file"):
        read_text_file(tmp_path / "missing.txt", "prompts file", "a text file")
    (tmp_path / "latin1.txt").write_bytes(b"caf\xe9\n")
    with pytest.raises(InputError, match=r"is not UTF-8 text .*; save it as UTF-8"):
        read_text_file(tmp_path / "latin1.txt", "prompts file", "a text file")
