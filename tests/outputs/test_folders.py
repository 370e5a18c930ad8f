"""The output-folder lock: one run per folder, a clear refusal naming the holder, no stale lock after a
kill; run markers, and a dead run's marker cleared."""

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from sagevideo.outputs.folders import LOCK_NAME, FolderLock, remove_dead_markers, run_marker

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}


class InUse(Exception):
    pass


def test_second_lock_is_refused_and_release_removes_the_file(tmp_path):
    first = FolderLock(tmp_path, InUse)
    first.acquire()
    holder = json.loads((tmp_path / LOCK_NAME).read_text())
    assert holder["pid"] == os.getpid() and holder["host"] == socket.gethostname() and holder["since"].endswith("UTC")
    with pytest.raises(InUse) as refused:
        FolderLock(tmp_path, InUse).acquire()
    expected = f"--out {tmp_path}: another sagevideo run is writing there (pid {os.getpid()} on "
    assert str(refused.value).startswith(expected)
    first.release()
    assert not (tmp_path / LOCK_NAME).exists()  # a finished run leaves nothing behind
    with FolderLock(tmp_path, InUse):
        pass


@pytest.mark.slow
def test_two_processes_one_folder(tmp_path):
    """A run holds the folder (a real process): `sagevideo generate` into it exits 2 before loading,
    naming the holder. Killed with SIGKILL, the holder leaves its lock file, which does not block."""
    out = tmp_path / "out"
    out.mkdir()
    hold = (
        "import sys; from sagevideo.outputs.folders import FolderLock\n"
        f"lock = FolderLock({str(out)!r}, RuntimeError); lock.acquire(); print('held', flush=True); sys.stdin.read()\n"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", hold, "--out", str(out)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        env=ENV,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        second = subprocess.run(
            [sys.executable, "-m", "sagevideo", "generate", "-p", "a cat", "--out", str(out), "--no-progress"],
            capture_output=True, text=True, env={**ENV, "HF_HUB_OFFLINE": "1"}, timeout=120,
        )
        assert second.returncode == 2, second.stderr
        *notes, line = second.stderr.strip().splitlines()  # the plan's notes, then the one error line
        assert all(note.startswith("sagevideo: ") for note in notes)
        assert line.startswith(f"sagevideo generate: error: --out {out}: another sagevideo run is writing there (")
        assert f"pid {holder.pid} on {socket.gethostname()}, `python -c --out {out}`, since " in line
        assert sorted(os.listdir(out)) == [LOCK_NAME]  # nothing rendered, no manifest
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert (out / LOCK_NAME).exists()  # the killed run's lock file, with its stale details
    lock = FolderLock(out, RuntimeError)
    lock.acquire()  # the OS let go of the dead process's lock: no wait, no manual clean-up
    assert json.loads((out / LOCK_NAME).read_text())["pid"] == os.getpid()
    lock.release()


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", ""])
    child.wait()
    return child.pid


def test_a_dead_runs_marker_is_removed_a_live_ones_is_kept(tmp_path):
    """A Ray driver killed outright (kill -9) leaves its marker, which later runs used to leave for
    good. Without the folder's lock (a file system without locks) only a marker naming a process of
    this host that is gone is known dead; with the lock held, no other run can be writing there."""
    host = socket.gethostname()
    with run_marker(tmp_path) as mine:
        assert json.loads(mine.read_text()) == {"pid": os.getpid(), "host": host}
        dead = tmp_path / ".sagevideo-run-0000dead"
        dead.write_text(json.dumps({"pid": _dead_pid(), "host": host}))
        empty = tmp_path / ".sagevideo-run-00000000"
        empty.touch()  # what a killed run of an earlier version left
        elsewhere = tmp_path / ".sagevideo-run-0e15e0e1"
        elsewhere.write_text(json.dumps({"pid": os.getpid(), "host": "another-machine"}))
        assert remove_dead_markers(tmp_path, locked=False) == [dead]
        assert mine.exists() and empty.exists() and elsewhere.exists()
    assert not mine.exists()  # the end of the block removes its own
    assert remove_dead_markers(tmp_path, locked=True) == [empty, elsewhere]
    assert os.listdir(tmp_path) == []
