"""Staged outputs: hidden names next to the final one, atomic commit, leftovers found precisely."""

import re

import numpy as np

from sagevideo.outputs.staging import commit, leftovers, remove_leftovers, staged_path
from sagevideo.outputs.video import write_mp4


def test_staged_file_is_hidden_and_committed_atomically(tmp_path):
    final = tmp_path / "shot-010.mp4"
    staged = staged_path(final)
    assert staged.parent == tmp_path and re.fullmatch(r"\.shot-010\.[0-9a-f]{8}\.staged\.mp4", staged.name)
    write_mp4(np.zeros((1, 16, 16, 3), np.uint8), staged)
    assert leftovers(final) == [staged] and not final.exists()
    commit(staged, final)
    assert final.is_file() and leftovers(final) == []


def test_leftovers_match_only_this_outputs_files(tmp_path):
    final = tmp_path / "shot.mp4"
    mine = [
        ".shot.0123abcd.staged.mp4",  # staged, never committed (worker killed before returning)
        "..shot.0123abcd.staged.4242-89abcdef.partial.mp4",  # write_mp4's temp of a staged file
        ".shot.4242-89abcdef.partial.mp4",  # write_mp4's temp of the final name (older runs)
    ]
    others = ["shot.mp4", ".preshot.0123abcd.staged.mp4", ".shot-2.0123abcd.staged.mp4", "manifest.jsonl", ".shot.txt"]
    for name in mine + others:
        (tmp_path / name).write_bytes(b"x")
    assert sorted(p.name for p in leftovers(final)) == sorted(mine)
    assert remove_leftovers(final) == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(others)
