"""sagevideo.outputs.files: a text file written whole or not at all."""

from __future__ import annotations

import errno
import os

import pytest

from sagevideo.outputs.files import write_text_atomic


def test_a_failed_write_leaves_the_earlier_file_and_no_partial_one(tmp_path, monkeypatch):
    path = tmp_path / "metrics.json"
    write_text_atomic(path, "first\n")
    assert path.read_text() == "first\n" and oct(path.stat().st_mode & 0o777) != "0o600"  # the umask's, not 0600

    def disk_full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", disk_full)  # where a full disk shows at the latest
    with pytest.raises(OSError) as failed:
        write_text_atomic(path, "second, longer\n")
    assert failed.value.errno == errno.ENOSPC
    assert path.read_text() == "first\n" and sorted(p.name for p in tmp_path.iterdir()) == ["metrics.json"]
