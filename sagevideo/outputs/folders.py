"""Output folders: create one and prove it is writable before any model loads."""

from __future__ import annotations

import tempfile
from pathlib import Path


def writable_folder(out: str | Path, error: type[Exception], file_hint: str = "") -> Path:
    """Create `out` if needed and check it accepts files (a probe file); raise `error(message)` when
    it is a file or not writable. file_hint: appended to the "is a file" message."""
    path = Path(out).expanduser()
    if path.exists() and not path.is_dir():
        raise error(f"--out {out}: is a file, not a folder{file_hint}")
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path, prefix=".sagevideo-probe-"):
            pass
    except OSError as err:
        raise error(f"--out {out}: cannot write there ({err.strerror or err}); give a writable folder") from None
    return path
