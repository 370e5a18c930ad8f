"""Model fingerprints: 12 hex digits of what decides a model's output, not of where it lies.

`folder_fingerprint(path)` hashes every file a folder model is loaded from (configs, tokenizer
files, weights: `model_files`) by its path inside the folder and the SHA-256 of its content, so
weights rewritten in place with the same shapes change it and a copy of the folder elsewhere
keeps it. A file's digest is computed once per state of the file: it is cached in
`fingerprints.json` under `cache_dir()` ($SAGEVIDEO_CACHE, else $XDG_CACHE_HOME/sagevideo, else
~/.cache/sagevideo) by (resolved path, size, mtime_ns, ctime_ns, inode). ctime is there because
`cp -p`, `rsync -t` and `touch -r` can set an mtime back, never a ctime; a file changed less than
`RACY_S` before it was hashed is not cached (its timestamps may not have moved yet, git's "racy"
case). Big folders show a progress bar (tqdm, on a terminal) while their files are first hashed.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

log = logging.getLogger("sagevideo")

CACHE_ENV = "SAGEVIDEO_CACHE"
CACHE_NAME = "fingerprints.json"
CACHE_VERSION = 1
CACHED_FROM_BYTES = 1 << 20  # smaller files are read again each time: cheaper than a cache entry
PROGRESS_FROM_BYTES = 1 << 30
CHUNK = 8 << 20  # hashlib releases the GIL on big updates, so threads hash several files at once
RACY_S = 2.0
# Not read by any family's loader (sagevideo loads safetensors only), or not part of the model at all.
SKIPPED_SUFFIXES = frozenset({
    ".md", ".png", ".jpg", ".jpeg", ".gif", ".webp", ".mp4", ".pdf",
    ".bin", ".pt", ".pth", ".ckpt", ".msgpack", ".h5", ".onnx", ".gguf",
})
SKIPPED_NAMES = ("readme", "license", "notice")


def fingerprint(parts: list[Any]) -> str:
    """12 hex digits of JSON-able parts (configs, seeds, digests)."""
    payload = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()[:12]


def cache_dir() -> Path:
    """sagevideo's cache folder: $SAGEVIDEO_CACHE, else $XDG_CACHE_HOME/sagevideo, else ~/.cache/sagevideo."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache").expanduser() / "sagevideo"


def model_files(path: Path) -> list[tuple[str, Path]]:
    """(path inside the folder, file) of every file that can change what the model makes, sorted:
    hidden files and folders (.git, .cache), docs and weight formats sagevideo does not load left out."""
    found = []
    for root, dirs, files in os.walk(path, followlinks=True):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in files:
            lower = name.lower()
            if name.startswith(".") or lower.startswith(SKIPPED_NAMES) or Path(lower).suffix in SKIPPED_SUFFIXES:
                continue
            file = Path(root) / name
            if file.is_file():
                found.append((file.relative_to(path).as_posix(), file))
    return sorted(found)


def folder_fingerprint(path: Path) -> str:
    """The fingerprint of a model folder: each model file's relative path and content SHA-256."""
    files = model_files(path)
    digests = FileDigests().of([file for _, file in files])
    return fingerprint([[rel, digest] for (rel, _), digest in zip(files, digests, strict=True)])


class FileDigests:
    """SHA-256 of files, through the cache file (see the module docstring)."""

    def __init__(self, cache: Path | None = None):
        self.cache = cache or cache_dir() / CACHE_NAME

    def of(self, files: list[Path]) -> list[str]:
        """The hex SHA-256 of each file, hashing only those the cache does not know in their state now."""
        entries = _read_cache(self.cache)
        states = [_state(file) for file in files]
        keys = [str(file.resolve()) for file in files]
        digests: list[str | None] = [
            _cached(entries.get(key), state) for key, state in zip(keys, states, strict=True)
        ]
        todo = [i for i, digest in enumerate(digests) if digest is None]
        if not todo:
            return digests  # type: ignore[return-value]
        total = sum(states[i]["size"] for i in todo)
        started = time.time_ns()
        with _progress(total) as advance, ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1)) as pool:
            for i, digest in zip(todo, pool.map(lambda i: _sha256(files[i], advance), todo), strict=True):
                digests[i] = digest
        fresh = {}
        for i in todo:
            state = states[i]
            changed = _state(files[i]) != state  # written to while it was hashed
            racy = started - max(state["mtime_ns"], state["ctime_ns"]) < RACY_S * 1e9
            if state["size"] >= CACHED_FROM_BYTES and not changed and not racy:
                fresh[keys[i]] = {**state, "sha256": digests[i]}
        if fresh:
            _write_cache(self.cache, fresh)
        return digests  # type: ignore[return-value]


def _state(file: Path) -> dict[str, int]:
    st = file.stat()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns, "ino": st.st_ino}


def _cached(entry: Any, state: dict[str, int]) -> str | None:
    if not isinstance(entry, dict) or any(entry.get(k) != v for k, v in state.items()):
        return None
    digest = entry.get("sha256")
    return digest if isinstance(digest, str) and len(digest) == 64 else None


def _sha256(file: Path, advance: Any) -> str:
    digest = hashlib.sha256()
    buffer = bytearray(CHUNK)
    view = memoryview(buffer)
    with open(file, "rb", buffering=0) as f:
        while n := f.readinto(buffer):
            digest.update(view[:n])
            advance(n)
    return digest.hexdigest()


@contextlib.contextmanager
def _progress(total: int):
    """A bytes bar for big first hashes (tqdm: shown on a terminal only); yields its update."""
    from tqdm.auto import tqdm

    bar = tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, leave=False,
               desc="sagevideo: hashing the model's files (once per file)",
               disable=None if total >= PROGRESS_FROM_BYTES else True)
    try:
        yield bar.update
    finally:
        bar.close()


def _read_cache(path: Path) -> dict[str, Any]:
    """The cache's entries; {} when it is missing, unreadable or of another version (it is only a cache)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("version") != CACHE_VERSION or not isinstance(data.get("files"), dict):
        return {}
    return data["files"]


_warned: set[str] = set()


def _write_cache(path: Path, fresh: dict[str, Any]) -> None:
    """Add entries (merged with what another process may have written since), dropping files that
    are gone; atomic (temp file + rename). A cache that cannot be written is said once: every run
    then hashes the weights again."""
    entries = {key: entry for key, entry in _read_cache(path).items() if os.path.exists(key)}
    entries.update(fresh)
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump({"version": CACHE_VERSION, "files": entries}, f)
        os.replace(tmp, path)
    except OSError as err:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        if str(path) not in _warned:
            _warned.add(str(path))
            log.warning(f"sagevideo: cannot write the model fingerprint cache {path} ({err.strerror or err}); "
                        f"model files are hashed again on every run; set {CACHE_ENV} to a writable folder")
