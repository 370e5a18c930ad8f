"""Output files given on the command line (a plan, a JSON report): checked before any work."""

from __future__ import annotations

import tempfile
from pathlib import Path


def writable_file(path: str | Path, option: str, error: type[Exception], example: str = "plan.json") -> Path:
    """Check that a file can be written at `path` without losing anything: not a folder, its folder
    exists and accepts files (a probe file). Raises `error(message)` naming `option`; an existing
    file is fine (it is replaced when the work is done)."""
    path = Path(path).expanduser()
    if path.is_dir():
        raise error(f"{option} {path}: is a folder; give a file name, e.g. {path / example}")
    folder = path.parent
    if not folder.is_dir():
        raise error(f"{option} {path}: folder {folder} does not exist; create it first or give another path")
    try:
        with tempfile.TemporaryFile(dir=folder, prefix=".sagevideo-probe-"):
            pass
    except OSError as err:
        why = err.strerror or err
        raise error(f"{option} {path}: cannot write in {folder} ({why}); give a writable path") from None
    return path
