"""Output files given on the command line (a plan, a JSON report): checked before any work, and
written whole or not at all."""

from __future__ import annotations

import contextlib
import os
import secrets
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


def write_text_atomic(path: str | Path, text: str) -> Path:
    """Write `text` (UTF-8) to `path` whole or not at all: a hidden file beside it, fsynced, then
    renamed over it (atomic within one file system). On any error (OSError: a full disk is ENOSPC)
    the hidden file is removed and an earlier file at `path` is untouched. Returns the path.

    Hand-written (the stdlib does it in a few lines; atomicwrites, the library for it, is archived)."""
    path = Path(path)
    # a unique name opened with "x": the umask's permissions, as any other output (mkstemp's are 0600)
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{secrets.token_hex(4)}.partial")
    try:
        with open(tmp, "x", encoding="utf-8") as file:
            file.write(text)
            file.flush()
            os.fsync(file.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return path
