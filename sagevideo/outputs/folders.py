"""Output folders: create one and prove it is writable before any model loads; lock it for a run;
mark it as a run's (Ray workers check that they see the marker), clear the marks of dead runs, and
mark the folders of a `sagevideo ab` run, which other runs stay out of."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import socket
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path


def writable_folder(out: str | Path, error: type[Exception], file_hint: str = "") -> Path:
    """Create `out` if needed and check it accepts files (a probe file); raise `error(message)` when
    it is a file or not writable. file_hint: appended to the "is a file" message."""
    path = Path(out).expanduser()
    reason = folder_write_problem(path)
    if reason == IS_A_FILE:
        raise error(f"--out {out}: is a file, not a folder{file_hint}")
    if reason:
        raise error(f"--out {out}: cannot write there ({reason}); give a writable folder")
    return path


IS_A_FILE = "it is a file, not a folder"


def folder_write_problem(path: Path) -> str | None:
    """Create the folder `path` if needed and write a probe file in it: why that failed (IS_A_FILE,
    '/a/b is a file, not a folder' for a parent, or the system's reason: 'Read-only file system'), or None."""
    if path.exists() and not path.is_dir():
        return IS_A_FILE
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path, prefix=".sagevideo-probe-"):
            pass
    except OSError as err:
        blocker = next((p for p in path.parents if p.exists() and not p.is_dir()), None)
        if blocker is not None:  # NotADirectoryError names no path: say which one is in the way
            return f"{blocker} is a file, not a folder"
        return err.strerror or str(err)
    return None


LOCK_NAME = ".sagevideo.lock"


class FolderLock:
    """An exclusive lock on an output folder for one run: `acquire()` or a clear error, `release()`.

    The lock is an OS file lock (flock, through the `filelock` library) on `.sagevideo.lock` in
    the folder, which also holds who took it (pid, host, command, since). The OS drops the lock
    when its process dies, however it dies, so a killed run never blocks the next one; the file it
    leaves holds stale details that nobody reads (they are read only while the lock is held).
    """

    def __init__(self, folder: str | Path, error: type[Exception]):
        self.folder = Path(folder)
        self.path = self.folder / LOCK_NAME
        self.error = error
        self._lock = None

    def acquire(self, note: Callable[[str], None] | None = None) -> None:
        """Take the lock at once or raise `error(message)` naming the run that holds it. On a file
        system without working file locks (some network mounts), say so through `note` and go on
        without one."""
        from filelock import FileLock, Timeout

        # thread_local=False: one lock per run, whichever thread releases it.
        lock = FileLock(self.path, timeout=0, thread_local=False, on_acquired=_write_holder)
        try:
            lock.acquire()
        except Timeout:
            raise self.error(self._in_use_message()) from None
        except OSError as err:
            if note is not None:
                note(
                    f"sagevideo: --out {self.folder}: cannot lock the folder ({err.strerror or err}); make sure "
                    "no other run writes there at the same time"
                )
            return
        self._lock = lock

    @property
    def held(self) -> bool:
        """Whether this run holds the lock (False before `acquire`, after `release`, or where the
        file system has no file locks)."""
        return self._lock is not None

    def release(self) -> None:
        """Remove the lock file, then let go of the lock (a run that opens the file meanwhile sees
        it unlinked and retries on a fresh one, which the library checks)."""
        if self._lock is None:
            return
        with contextlib.suppress(OSError):
            self.path.unlink()
        self._lock.release()
        self._lock = None

    def __enter__(self) -> FolderLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def _in_use_message(self) -> str:
        try:
            holder = json.loads(self.path.read_text(encoding="utf-8"))
            who = (
                f"pid {holder['pid']} on {holder['host']}, `{holder['command']}`, since {holder['since']}"
            )
        except (OSError, ValueError, KeyError, TypeError):  # taken a moment ago, details not written yet
            who = "details not written yet"
        return (
            f"--out {self.folder}: another sagevideo run is writing there ({who}); wait for it to finish, "
            "or give another --out (two runs into one folder would render every job twice)"
        )


def _write_holder(fd: int) -> None:
    """Record who holds the lock in the lock file (called by filelock with the locked descriptor)."""
    import shlex
    import socket
    import sys
    from datetime import datetime, timezone

    program = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "python"
    if program in ("__main__.py", "sagevideo"):  # python -m sagevideo, or the console script
        program = "sagevideo"
    elif program == "-c":
        program = "python -c"
    holder = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "command": " ".join([program, shlex.join(sys.argv[1:])]).strip(),
        "since": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
    }
    # Only details for an error message: a full disk must not cost the lock itself.
    with contextlib.suppress(OSError):
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(holder).encode("utf-8"), 0)


MARKER_PREFIX = ".sagevideo-run-"


@contextlib.contextmanager
def run_marker(folder: str | Path) -> Iterator[Path]:
    """A file only this run's driver writes into `folder`, `.sagevideo-run-<8 hex>`, for the block:
    a Ray worker that cannot see it is not looking at the same folder. It holds this process's pid
    and host, so a later run can tell a dead run's marker (`remove_dead_markers`)."""
    marker = Path(folder) / f"{MARKER_PREFIX}{secrets.token_hex(4)}"
    with open(marker, "x", encoding="utf-8") as f:
        with contextlib.suppress(OSError):  # a full disk: an empty marker still proves the folder
            f.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname()}))
    try:
        yield marker
    finally:
        marker.unlink(missing_ok=True)


def remove_dead_markers(folder: str | Path, *, locked: bool) -> list[Path]:
    """Remove the markers of runs that are gone (killed before they could remove theirs): with the
    folder's lock held (`locked`), every marker, since no other run can be writing there; without
    one (a file system without locks), those naming a process of this host that no longer runs.
    Returns the markers removed."""
    import psutil

    removed = []
    for marker in sorted(Path(folder).glob(f"{MARKER_PREFIX}*")):
        if not locked:
            try:
                holder = json.loads(marker.read_text(encoding="utf-8"))
                dead = holder["host"] == socket.gethostname() and not psutil.pid_exists(int(holder["pid"]))
            except (OSError, ValueError, KeyError, TypeError):  # empty (an older run's) or unreadable: unknown
                dead = False
            if not dead:
                continue
        with contextlib.suppress(FileNotFoundError):
            marker.unlink()
            removed.append(marker)
    return removed


AB_MARKER = ".sagevideo-ab.json"


def mark_ab_folder(folder: str | Path, arm: str) -> None:
    """Mark `folder` as part of a `sagevideo ab` run: arm "" is the run's own folder, else the
    arm's path inside it ("full", "arms/sage-fp8"). Relative, so a moved run keeps its marks."""
    (Path(folder) / AB_MARKER).write_text(json.dumps({"ab_arm": arm}) + "\n", encoding="utf-8")


def ab_arm_of(folder: str | Path) -> str | None:
    """The `mark_ab_folder` arm of `folder` ("" for an ab run's own folder), or None when no ab run
    marked it. A marker that cannot be read still marks the folder (its arm reads as "?")."""
    path = Path(folder).expanduser() / AB_MARKER
    if not path.is_file():
        return None
    try:
        arm = json.loads(path.read_text(encoding="utf-8"))["ab_arm"]
    except (OSError, ValueError, KeyError, TypeError):
        return "?"
    return arm if isinstance(arm, str) else "?"


def ab_folder_problem(out: str | Path) -> str | None:
    """Why a run that is not `sagevideo ab` must not write into `out` (an ab run's folder or arm), or None."""
    arm = ab_arm_of(out)
    if arm is None:
        return None
    path = Path(out).expanduser()
    if arm == "":
        return (f"--out {out}: holds a `sagevideo ab` run (its arms and report); give another --out, or re-run "
                "that ab command to resume it")
    root = path.parents[len(Path(arm).parts) - 1] if arm != "?" else path.parent
    return (f"--out {out}: is the {arm!r} arm of the `sagevideo ab` run in {root}, which renders there (and would "
            "set aside what another run wrote); give another --out, or re-run that ab command to resume it")
