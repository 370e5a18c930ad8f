"""Staged outputs: workers write finished videos under hidden names; the driver renames them.

With several workers and retries after a worker dies, only the process that writes the
manifest decides which attempt's file becomes the output. So a worker writes the mp4 (itself
temp+rename, see `video.write_mp4`) to a hidden *staged* name next to the final one, and the
driver `commit`s it (an atomic `os.replace`) right before it records the job as done. A final
name therefore never holds a file the manifest does not vouch for, and a job retried after its
worker died is never written twice under its final name.

Names, for final `shot-010.mp4` (and, with frames_png, the folder `shot-010_frames/`):
    .shot-010.<8 hex>.staged.mp4                          a finished video waiting for its commit
    ..shot-010.<8 hex>.staged.<pid>-<8 hex>.partial.mp4   write_mp4's temporary file of it
    .shot-010_frames.<8 hex>.staged/                      a finished frames folder waiting for its commit
    .shot-010_frames.<8 hex>.old/                         a replaced frames folder, being deleted
A killed worker (or driver) can leave any of them behind; `remove_leftovers` deletes them.

An output already under a final name that another job wrote (a job whose prompt or settings
changed, keeping its `output:` name) is never replaced: `keep_aside` renames it first, e.g.
`shot-010.mp4` -> `shot-010.was-<first 10 digits of that job's id>.mp4` (and
`shot-010_frames/` -> `shot-010.was-<id>_frames/`).
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
from pathlib import Path

from sagevideo.outputs.video import _fsync_dir, _fsync_file


def staged_path(final: str | Path) -> Path:
    """A fresh hidden name in the final file's folder (same filesystem, so the rename is atomic)."""
    final = Path(final)
    return final.with_name(f".{final.stem}.{secrets.token_hex(4)}.staged{final.suffix}")


def commit(staged: str | Path, final: str | Path) -> Path:
    """Move a staged file to its final name atomically and durably; returns the final path."""
    final = Path(final)
    os.replace(staged, final)
    _fsync_dir(final.parent)
    return final


def commit_folder(staged: str | Path, final: str | Path) -> Path:
    """Move a staged folder to its final name; a folder already there (a run killed between its
    rename and its manifest line) is moved aside first and deleted after. Returns the final path."""
    final = Path(final)
    old = None
    if final.exists():
        old = final.with_name(f".{final.name}.{secrets.token_hex(4)}.old")
        os.replace(final, old)
    os.replace(staged, final)
    _fsync_dir(final.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return final


def stage_copy(source: str | Path, final: str | Path) -> tuple[Path, str]:
    """Another output's finished file under a fresh staged name of `final`: (staged path, "hardlink"
    or "copy"). A hard link costs no space and nothing writes a committed file in place (renders
    replace names), so the two names cannot drift apart; a copy where links fail (another file
    system, a file system without them)."""
    staged = staged_path(final)
    try:
        os.link(source, staged)
        return staged, "hardlink"
    except OSError:
        shutil.copyfile(source, staged)
        _fsync_file(staged)
        return staged, "copy"


def stage_folder_copy(source: str | Path, final: str | Path) -> tuple[Path, str]:
    """Another output's finished folder (PNG frames) under a fresh staged name of `final`, its files
    hard-linked (or copied where links fail): (staged path, "hardlink" or "copy")."""
    staged = staged_path(final)
    staged.mkdir()
    how = "hardlink"
    for file in sorted(Path(source).iterdir()):
        if how == "hardlink":
            try:
                os.link(file, staged / file.name)
                continue
            except OSError:
                how = "copy"
        shutil.copyfile(file, staged / file.name)
        _fsync_file(staged / file.name)
    _fsync_dir(staged)
    return staged, how


def leftovers(final: str | Path) -> list[Path]:
    """Staged and partial files (or folders) of `final` (and write_mp4's own partials of it) in its folder."""
    final = Path(final)
    stem, suffix = re.escape(final.stem), re.escape(final.suffix)
    pattern = re.compile(
        rf"\.\.?{stem}\.[0-9a-f]{{8}}\.staged(\.\d+-[0-9a-f]{{8}}\.partial)?{suffix}"
        rf"|\.{stem}\.\d+-[0-9a-f]{{8}}\.partial{suffix}"
        rf"|\.{stem}{suffix}\.[0-9a-f]{{8}}\.old"
    )
    if not final.parent.is_dir():
        return []
    return sorted(p for p in final.parent.iterdir() if pattern.fullmatch(p.name))


def remove_leftovers(final: str | Path) -> int:
    """Delete what `leftovers` finds; returns how many files went."""
    removed = 0
    for path in leftovers(final):
        with contextlib.suppress(FileNotFoundError):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
            removed += 1
    return removed


def kept_name(final: str | Path, tag: str, number: int = 1) -> Path:
    """Where `keep_aside` puts an earlier output: `<stem>.was-<tag>[-N]<suffix>` (`_frames` folders
    keep their ending, so the kept mp4 and frames still pair by name)."""
    final = Path(final)
    mark = f".was-{tag}" + (f"-{number}" if number > 1 else "")
    if final.name.endswith("_frames"):
        return final.with_name(f"{final.name.removesuffix('_frames')}{mark}_frames")
    return final.with_name(f"{final.stem}{mark}{final.suffix}")


def keep_aside(final: str | Path, tag: str) -> Path:
    """Rename an existing output (file or folder) to its first free `kept_name`; returns the new path."""
    final = Path(final)
    number = 1
    while (kept := kept_name(final, tag, number)).exists():
        number += 1
    os.rename(final, kept)
    _fsync_dir(final.parent)
    return kept
