"""Staged outputs: hidden names next to the final one, atomic commit, leftovers found precisely."""

import re

import imageio.v3 as iio
import numpy as np

from sagevideo.outputs.staging import commit, commit_folder, leftovers, remove_leftovers, staged_path
from sagevideo.outputs.video import write_frames_png, write_mp4


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


def test_a_frames_folder_is_staged_committed_and_replaces_an_uncommitted_one(tmp_path):
    frames = np.arange(2 * 16 * 16 * 3, dtype=np.uint8).reshape(2, 16, 16, 3)
    final = tmp_path / "shot_frames"
    staged = write_frames_png(frames, staged_path(final))
    assert re.fullmatch(r"\.shot_frames\.[0-9a-f]{8}\.staged", staged.name)
    assert sorted(p.name for p in staged.iterdir()) == ["frame_00000.png", "frame_00001.png"]
    assert leftovers(final) == [staged]
    # A folder under the final name that no manifest line vouches for (a run killed between
    # rename and record) is replaced, not merged into.
    final.mkdir()
    (final / "frame_00099.png").write_bytes(b"stale")
    commit_folder(staged, final)
    assert sorted(p.name for p in final.iterdir()) == ["frame_00000.png", "frame_00001.png"]
    assert np.array_equal(iio.imread(final / "frame_00001.png"), frames[1])
    assert leftovers(final) == [] and sorted(p.name for p in tmp_path.iterdir()) == ["shot_frames"]


def test_leftover_frame_folders_are_removed_with_their_files(tmp_path):
    final = tmp_path / "shot_frames"
    for name in (".shot_frames.0123abcd.staged", ".shot_frames.89abcdef.old"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "frame_00000.png").write_bytes(b"x")
    (tmp_path / "shot_frames").mkdir()
    assert remove_leftovers(final) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shot_frames"]
