"""Model fingerprints follow what decides the output (the content of the files a model is loaded
from), not where the folder lies; each file is hashed once per state through the digest cache."""

import hashlib
import logging
import os
import shutil
import time

import pytest

import sagevideo.pipelines.fingerprint as fp
from sagevideo.pipelines.loading import resolve_model
from tests.helpers.weights import rewrite_in_place


def test_weights_rewritten_in_place_change_it_a_copy_elsewhere_does_not(tmp_path, tiny_pipe):
    """Before, the fingerprint was the configs and the weight files' sizes: a fine-tune written over
    the same files (same shapes, so the same sizes) kept it, and its old renders counted as done."""
    folder = tmp_path / "a"
    tiny_pipe.save_pretrained(folder, safe_serialization=True)
    first = resolve_model(str(folder)).fingerprint
    assert resolve_model(str(shutil.copytree(folder, tmp_path / "b"))).fingerprint == first
    (folder / "README.md").write_text("# notes")
    (folder / ".cache").mkdir()
    (folder / ".cache" / "download.json").write_text("{}")
    assert resolve_model(str(folder)).fingerprint == first  # docs and hidden files are not the model

    weights = folder / "transformer" / "diffusion_pytorch_model.safetensors"
    size = weights.stat().st_size
    rewrite_in_place(weights)
    assert weights.stat().st_size == size
    assert resolve_model(str(folder)).fingerprint != first
    again = resolve_model(str(folder)).fingerprint
    (folder / "tokenizer" / "spiece.model").write_bytes(b"\0" * 16)  # a sentencepiece tokenizer's vocabulary
    assert resolve_model(str(folder)).fingerprint != again


@pytest.fixture
def counted(monkeypatch):
    """The files hashed (read whole), in order; small files and fresh timestamps cached too."""
    monkeypatch.setattr(fp, "RACY_S", 0.0)
    monkeypatch.setattr(fp, "CACHED_FROM_BYTES", 1)
    hashed, real = [], fp._sha256
    monkeypatch.setattr(fp, "_sha256", lambda file, advance: hashed.append(file.name) or real(file, advance))
    return hashed


def test_a_file_is_hashed_once_per_state(tmp_path, counted):
    file = tmp_path / "w.safetensors"
    file.write_bytes(os.urandom(3 << 20))
    digests = fp.FileDigests(tmp_path / "cache" / "fingerprints.json")
    assert digests.of([file]) == [hashlib.sha256(file.read_bytes()).hexdigest()] and counted == ["w.safetensors"]
    assert fp.FileDigests(tmp_path / "cache" / "fingerprints.json").of([file]) == digests.of([file])
    assert len(counted) == 1  # read from the cache, in another FileDigests (another run) too

    # Other bytes of the same size, the mtime set back as `cp -p` or `touch -r` do: the ctime moved.
    stat = file.stat()
    time.sleep(0.02)
    with open(file, "r+b") as f:
        f.write(b"\1" * 64)
    os.utime(file, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert digests.of([file]) == [hashlib.sha256(file.read_bytes()).hexdigest()] and len(counted) == 2


def test_a_file_changed_just_before_it_is_hashed_is_not_cached(tmp_path, counted, monkeypatch):
    """Its timestamps may not have moved yet when it changes again (the same clock tick)."""
    monkeypatch.setattr(fp, "RACY_S", 60.0)
    file = tmp_path / "w.safetensors"
    file.write_bytes(b"x" * 1000)
    digests = fp.FileDigests(tmp_path / "fingerprints.json")
    digests.of([file])
    digests.of([file])
    assert len(counted) == 2 and not (tmp_path / "fingerprints.json").exists()


def test_a_broken_or_unwritable_cache_is_only_slower(tmp_path, counted, caplog):
    file = tmp_path / "w.safetensors"
    file.write_bytes(b"y" * 1000)
    want = [hashlib.sha256(b"y" * 1000).hexdigest()]
    cache = tmp_path / "fingerprints.json"
    cache.write_text('{"version": 1, "files": {"' + str(file) + '": [')  # torn
    assert fp.FileDigests(cache).of([file]) == want
    assert fp.FileDigests(cache).of([file]) == want and len(counted) == 1  # rewritten whole

    (tmp_path / "not-a-folder").write_text("")
    blocked = fp.FileDigests(tmp_path / "not-a-folder" / "fingerprints.json")
    with caplog.at_level(logging.WARNING, logger="sagevideo"):
        assert blocked.of([file]) == want and blocked.of([file]) == want
    (warning,) = [r.getMessage() for r in caplog.records]  # said once
    assert "cannot write the model fingerprint cache" in warning and "set SAGEVIDEO_CACHE" in warning


def test_the_cache_folder_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("SAGEVIDEO_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert fp.cache_dir() == tmp_path / "xdg" / "sagevideo"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert fp.cache_dir() == fp.Path("~/.cache/sagevideo").expanduser()
    monkeypatch.setenv("SAGEVIDEO_CACHE", str(tmp_path / "mine"))
    assert fp.cache_dir() == tmp_path / "mine"
