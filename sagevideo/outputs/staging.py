"""Staged outputs: workers write finished videos under hidden names; the driver renames them.

With several workers and retries after a worker dies, only the process that writes the
manifest decides which attempt's file becomes the output. So a worker writes the mp4 (itself
temp+rename, see `video.write_mp4`) to a hidden *staged* name next to the final one, and the
driver `commit`s it (an atomic `os.replace`) right before it records the job as done. A final
name therefore never holds a file the manifest does not vouch for, and a job retried after its
worker died is never written twice under its final name.

Names, for final `shot-010.mp4`:
    .shot-010.<8 hex>.staged.mp4                          a finished video waiting for its commit
    ..shot-010.<8 hex>.staged.<pid>-<8 hex>.partial.mp4   write_mp4's temporary file of it
A killed worker can leave either behind; `remove_leftovers` deletes them.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
from pathlib import Path

from sagevideo.outputs.video import _fsync_dir


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


def leftovers(final: str | Path) -> list[Path]:
    """Staged and partial files of `final` (and write_mp4's own partials of it) in its folder."""
    final = Path(final)
    stem, suffix = re.escape(final.stem), re.escape(final.suffix)
    pattern = re.compile(
        rf"\.\.?{stem}\.[0-9a-f]{{8}}\.staged(\.\d+-[0-9a-f]{{8}}\.partial)?{suffix}"
        rf"|\.{stem}\.\d+-[0-9a-f]{{8}}\.partial{suffix}"
    )
    if not final.parent.is_dir():
        return []
    return sorted(p for p in final.parent.iterdir() if pattern.fullmatch(p.name))


def remove_leftovers(final: str | Path) -> int:
    """Delete what `leftovers` finds; returns how many files went."""
    removed = 0
    for path in leftovers(final):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
            removed += 1
    return removed
