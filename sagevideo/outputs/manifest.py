"""The manifest: `manifest.jsonl` in the output folder, one JSON object per job attempt.

Records are appended one line at a time, each in one write and fsynced; a write that fails
(disk full, quota, file-size limit) is cut back off, so a line is there whole or not at all and
the append raises `ManifestWriteError`. A line that is not a record (a torn write from a run
killed mid-write, or valid JSON with a field of the wrong type) is skipped when reading;
`quarantine()` copies it once into manifest.bad-lines.jsonl and says so, so later runs neither
crash on it nor warn again. The latest record of a job id decides whether a re-run skips it:
status "done" and every output present (and no later done job wrote the same file). Only the
driver process appends, one record per job per run, even when Ray workers run the jobs; plus,
when a job's render replaces an earlier one of a changed job under the same name, a copy of the
earlier job's record naming the new place of its kept video (see `batch_run`).

Record fields: job_id, status ("done"/"failed"), error, prompt, negative_prompt, seed, frames,
height, width, steps, guidance, name, model, model_fingerprint, attention ("sage"/"full"), pv,
backend (the one the processors were given: --backend auto on CPU becomes "reference"; None for
"full"), plan (attention-plan path or None), plan_sha256 (its first 16 hex digits), device,
dtype, fps, backends (what ran: `record_backends().summary()`), timings (load_s, denoise_s,
decode_s, write_s), outputs (paths relative to the output folder: the mp4, then the PNG frames
folder for frames_png jobs), attempts (runs it took: more than 1 when a worker died under it),
retries (one {attempt, error, worker} per such death), worker ({host, pid, node}: who ran the
last attempt; node is the Ray node id, None without Ray; with --gpus-per-job, rank 0 of the
group, plus rank and ranks), started (UTC ISO time the last attempt began on its worker, after
any model load; None when no worker returned a record), created (UTC ISO time of the record),
sagevideo_version.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, StrictInt, StrictStr, ValidationError

MANIFEST_NAME = "manifest.jsonl"
BAD_LINES_NAME = "manifest.bad-lines.jsonl"


class _RecordTypes(BaseModel):
    """The types of the record fields that resuming, pairing and reports rely on (others pass as they
    are): a line that breaks them is set aside instead of crashing a reader."""

    model_config = ConfigDict(extra="allow", strict=True)
    job_id: StrictStr
    status: StrictStr | None = None
    error: StrictStr | None = None
    outputs: list[StrictStr] | None = None
    prompt: StrictStr | None = None
    negative_prompt: StrictStr | None = None
    seed: StrictInt | None = None
    frames: StrictInt | None = None
    height: StrictInt | None = None
    width: StrictInt | None = None
    steps: StrictInt | None = None
    fps: StrictInt | None = None
    attempts: StrictInt | None = None
    retries: list | None = None
    backends: dict | None = None
    timings: dict | None = None
    worker: dict | None = None


@dataclass(frozen=True)
class BadLine:
    """A manifest line that is not a usable record: its 1-based number, text and why."""

    number: int
    text: str
    reason: str

    @property
    def key(self) -> str:
        return hashlib.sha256(f"{self.number}:{self.text}".encode()).hexdigest()[:16]


def record_problem(record: Any) -> str | None:
    """Why a parsed JSON line is not a usable record, or None."""
    if not isinstance(record, dict):
        return f"a JSON {type(record).__name__}, not a record"
    try:
        _RecordTypes.model_validate(record)
    except ValidationError as err:
        e = err.errors()[0]
        field = ".".join(str(part) for part in e["loc"]) or "record"
        return f"field {field}: {e['msg']} (got {e.get('input')!r})"[:200]
    return None


class ManifestWriteError(RuntimeError):
    """A record could not be appended (nothing of it stays in the file). errno: ENOSPC, EFBIG, ... or None."""

    def __init__(self, message: str, errno_: int | None = None):
        super().__init__(message)
        self.errno = errno_


class Manifest:
    """Append-only JSON-lines file of job records."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.bad_lines: list[BadLine] = []  # found by the last records()

    def records(self) -> list[dict[str, Any]]:
        """Every usable record in file order; the other lines are listed in `bad_lines`."""
        self.bad_lines = []
        if not self.path.exists():
            return []
        records = []
        # errors="replace": a torn multi-byte character must not make the whole manifest unreadable
        with self.path.open(encoding="utf-8", errors="replace") as f:
            for number, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except ValueError:
                    self.bad_lines.append(BadLine(number, line.rstrip("\n"), "not valid JSON (a torn write?)"))
                    continue
                problem = record_problem(record)
                if problem:
                    self.bad_lines.append(BadLine(number, line.rstrip("\n"), problem))
                    continue
                records.append(record)
        return records

    def quarantine(self) -> list[str]:
        """Copy bad lines not seen before into manifest.bad-lines.jsonl (the manifest itself is left as
        it is: another process may be appending to it); one message per newly found line."""
        self.records()
        if not self.bad_lines:
            return []
        side = self.path.with_name(BAD_LINES_NAME)
        known = set()
        if side.is_file():
            for line in side.read_text(encoding="utf-8", errors="replace").splitlines():
                try:
                    known.add(json.loads(line)["key"])
                except (ValueError, KeyError, TypeError):
                    continue
        new = [bad for bad in self.bad_lines if bad.key not in known]
        if not new:
            return []
        with side.open("a", encoding="utf-8") as f:
            for bad in new:
                entry = {"key": bad.key, "line": bad.number, "reason": bad.reason, "text": bad.text, "found": now_iso()}
                f.write(json.dumps(entry, ensure_ascii=False) + "\n")
        return [
            f"{self.path.name} line {bad.number} is not a usable record ({bad.reason}); it is ignored (its job, if "
            f"any, runs again) and was copied to {side.name}"
            for bad in new
        ]

    def latest(self) -> dict[str, dict[str, Any]]:
        """job_id -> its most recent record."""
        return {record["job_id"]: record for record in self.records()}

    def append(self, record: dict[str, Any]) -> None:
        """Append one record as one line, durably: the whole line or, on ManifestWriteError, none of it."""
        line = (json.dumps(record, ensure_ascii=False, allow_nan=False) + "\n").encode("utf-8")
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o666)
        except OSError as err:
            raise self._error(err) from None
        try:
            size = os.fstat(fd).st_size
            # A run killed mid-write can leave a line without its newline; start a fresh line
            # so the torn one stays the only casualty.
            if size and os.pread(fd, 1, size - 1) != b"\n":
                line = b"\n" + line
            try:
                _write_all(fd, line)
                os.fsync(fd)
            except OSError as err:
                # Cut off what did get written: a half line would be a torn record for every later reader.
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, size)
                raise self._error(err) from None
        finally:
            os.close(fd)

    def _error(self, err: OSError) -> ManifestWriteError:
        from sagevideo.outputs.video import describe_os_error

        return ManifestWriteError(f"{self.path}: a record could not be written ({describe_os_error(err)})", err.errno)


def _write_all(fd: int, data: bytes) -> None:
    """os.write until all of `data` is written; a write that makes no progress is ENOSPC."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        if written <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        view = view[written:]


def is_done(record: dict[str, Any] | None, out_dir: Path) -> bool:
    """True when a record says done and all its outputs (files, and a PNG frames folder) exist in `out_dir`."""
    if not record or record.get("status") != "done":
        return False
    outputs = record.get("outputs") or []
    return bool(outputs) and all((out_dir / rel).exists() for rel in outputs)


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")
