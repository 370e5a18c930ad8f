"""The manifest: `manifest.jsonl` in the output folder, one JSON object per job attempt, each a
`ManifestRecord` (typed, schema versioned); this module alone writes and reads its lines.

Records are appended one line at a time, each in one write and fsynced; a write that fails
(disk full, quota, file-size limit) is cut back off, so a line is there whole or not at all and
the append raises `ManifestWriteError`. A line that is not a record (a torn write from a run
killed mid-write, valid JSON with a field of the wrong type, or a schema newer than this
sagevideo reads) is skipped when reading; `quarantine()` copies it once into
manifest.bad-lines.jsonl and says so, so later runs neither crash on it nor warn again. The
latest record of a job id decides whether a re-run skips it: status "done" and every output
present (and no later done job wrote the same file). Only the driver process appends, one record
per job per run, even when Ray workers run the jobs; plus, when a job's render replaces an
earlier one of a changed job under the same name, a copy of the earlier job's record naming the
new place of its kept video (see `sagevideo.generation.run`).

Schema versions (the "schema" key): 1, lines written before it existed (no "schema" key), with
the fields below; 2, the same fields plus "schema". Lines of every known version are read and
upgraded to the current one; a line of a newer version is set aside when reading (a newer
sagevideo wrote it), and `Manifest.newer_schema_problem()` says so for a run that would write there:
its records' meaning is unknown here, so this version must neither redo nor overwrite their jobs.

Record fields: schema, job_id, status ("done"/"failed"), error, prompt, negative_prompt, seed,
frames, height, width, steps, guidance, name, model, model_fingerprint, family (the model's family in
`sagevideo.pipelines.families`: "cogvideox", "wan", ...; None on lines written before it was recorded),
attention ("sage"/"full"),
pv, backend (the one the processors were given: --backend auto on CPU becomes "reference"; None
for "full"), plan (attention-plan path or None), plan_sha256 (its first 16 hex digits), sparse (the
job's block-sparse setting, `--sparse` text such as "dynamic:0.15"; None when off and on lines
written before it existed: an optional field, no schema change), image (the
input image's absolute path, image-to-video jobs; None otherwise), image_sha256 (its full SHA-256,
64 hex digits, as `sha256sum` prints it: what the job was made from; lines written before the
field existed have neither, which reads as None), device,
dtype, fps, backends (what ran: `record_backends().summary()`; under a block-sparse setting its
"sparse" gives per layer the calls, mean and least density that ran, per step the mean density, and
the reasons of calls the plan made sparse that ran dense: `attention.records.BackendLog.sparse_summary`),
timings (load_s, denoise_s,
first_step_s (inside denoise_s: step 1 with text encoding, compilation and warm-up), decode_s,
write_s), outputs (paths relative to the output folder: the mp4, then the PNG frames
folder for frames_png jobs), attempts (runs it took: more than 1 when a worker died under it),
retries (one {attempt, error, worker} per such death), worker ({host, pid, node}: who ran the
last attempt; node is the Ray node id, None without Ray; with --gpus-per-job, rank 0 of the
group, plus rank and ranks), started (UTC ISO time the last attempt began on its worker, after
any model load; None when no worker returned a record), created (UTC ISO time of the record),
sagevideo_version, recipe (the batch's speed recipe, `sagevideo.jobs.recipe.Recipe.settings()` plus
what was applied: fp8_layers (count), kept_layers, compiled_blocks, cache_forwards and
cache_skipped (the job's transformer forwards the step cache decided on and skipped; None where
diffusers does not expose it), compile_cache_lookups (with compile: the job's hits, misses and
bypasses of Inductor's FX-graph cache and AOTAutograd's cache, by torch's counter names); None
for a plain recipe and on lines written before it existed, which read as they are: an optional
field, no schema change), scheduler (the class name of the pipeline's scheduler that ran the job:
"NoiseFirstDPMScheduler" where sagevideo drew CogVideoX-5B's step noise ahead,
`sagevideo.pipelines.cogvideox.noise_first`; optional, None on older lines), render_key (16 hex
digits of what decides the pixels, `sagevideo.jobs.identity`: jobs that share it make the same
video; None on older lines, which are then never reused), reused (for a job made without
rendering from a finished render of the same video: {job_id: the record it was made from (the
job's own when PNG frames were added to it), video: "kept" (already under its name), "hardlink"
or "copy", frames: None, "kept", "hardlink", "copy" or "decoded" (from the mp4)}; None for a
render; backends, recipe, scheduler and device then are the source's). Unknown keys (another tool's, or a
newer version's extras) are kept as they are.
"""

from __future__ import annotations

import contextlib
import copy
import errno
import hashlib
import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, ValidationError, field_validator, with_config
from typing_extensions import TypedDict

MANIFEST_NAME = "manifest.jsonl"
BAD_LINES_NAME = "manifest.bad-lines.jsonl"
SCHEMA_VERSION = 2


@with_config(ConfigDict(extra="allow"))
class WorkerInfo(TypedDict, total=False):
    """Who ran a job: host name, process id, Ray node id (None without Ray); rank/ranks in a group."""

    host: str
    pid: int
    node: str | None
    rank: int
    ranks: int


@with_config(ConfigDict(extra="allow"))
class Retry(TypedDict, total=False):
    """One attempt a worker's death ended: its number, why, and the worker."""

    attempt: int
    error: str
    worker: WorkerInfo | None


@with_config(ConfigDict(extra="allow"))
class Timings(TypedDict, total=False):
    """Seconds of the job's phases (load_s: the model load, charged to a worker's first job;
    first_step_s: denoising start to the end of step 1, inside denoise_s: compilation and warm-up;
    recipe_s: applying the speed recipe (FP8 quantization, compile and cache set-up), charged to the
    job it was applied for; absent for plain recipes; process_to_first_step_s: from the start of
    the process the job ran in to the end of step 1, on the first job a worker ran: a worker's whole
    start-up (interpreter, imports, load, recipe, compilation or compile-cache load); in a process of
    the caller's own, e.g. a notebook's, it counts from that process's start); process_to_load_s:
    on that same record, the part of it before the model load began (interpreter, imports, planning)."""

    load_s: float | None
    denoise_s: float | None
    first_step_s: float | None
    recipe_s: float
    process_to_first_step_s: float
    process_to_load_s: float
    decode_s: float | None
    write_s: float | None


@with_config(ConfigDict(extra="allow"))
class BackendsSummary(TypedDict, total=False):
    """What attention ran (`record_backends().summary()`): label -> calls, fallback reason -> calls."""

    counts: dict[str, int]
    fallbacks: dict[str, int]
    unrouted: Any
    sparse: Any  # under a block-sparse setting: per layer and step the density that ran, dense calls' reasons


@with_config(ConfigDict(extra="allow"))
class Reused(TypedDict, total=False):
    """How a job was made from a finished render of the same video (see the module docstring)."""

    job_id: str
    video: str
    frames: str | None


class Handoff(BaseModel):
    """What a worker tells the driver beside the record; never written to the manifest.

    staged/staged_frames: the staged names of the mp4 and the PNG frames folder, for the driver to
    commit. device_error: a CUDA or out-of-memory error (a fresh worker may not have it).
    storage_full: the disk or quota was too full to write the video (the batch stops).
    in_place: made by the driver from finished files; an output without a staged name is already
    under its final name."""

    model_config = ConfigDict(frozen=True)

    staged: str | None = None
    staged_frames: str | None = None
    device_error: bool = False
    storage_full: bool = False
    in_place: bool = False


class ManifestRecord(BaseModel):
    """One manifest line, typed (fields: see the module docstring).

    Built by `sagevideo.host.pipeline_host.base_record` (or `ManifestRecord(job_id=..., ...)`),
    updated through its typed fields (assignment is validated; `replace(**fields)` for a changed
    copy), written by `Manifest.append` and read by `Manifest.records`. `to_json()` is its line;
    `record["status"]`, `record.get("error")` and `dict(record)` read that line's values, and a
    record equals a mapping with that line's keys and values, for scripts written against the JSON
    (code in sagevideo reads attributes)."""

    model_config = ConfigDict(extra="allow", validate_assignment=True, populate_by_name=True)

    schema_version: StrictInt = Field(SCHEMA_VERSION, alias="schema")
    job_id: StrictStr
    status: Literal["done", "failed"] | None = None
    error: StrictStr | None = None
    prompt: StrictStr | None = None
    negative_prompt: StrictStr | None = None
    seed: StrictInt | None = None
    frames: StrictInt | None = None
    height: StrictInt | None = None
    width: StrictInt | None = None
    steps: StrictInt | None = None
    guidance: float | None = None
    name: str | None = None
    model: str | None = None
    model_fingerprint: str | None = None
    family: str | None = None
    attention: str | None = None
    pv: str | None = None
    backend: str | None = None
    plan: str | None = None
    plan_sha256: str | None = None
    sparse: str | None = None
    image: str | None = None
    image_sha256: str | None = None
    device: str | None = None
    dtype: str | None = None
    fps: StrictInt | None = None
    backends: BackendsSummary | None = None
    timings: Timings | None = None
    outputs: list[StrictStr] = Field(default_factory=list)
    attempts: StrictInt = 1
    retries: list[Retry] = Field(default_factory=list)
    worker: WorkerInfo | None = None
    started: str | None = None
    created: str | None = None
    sagevideo_version: str | None = None
    recipe: dict[str, Any] | None = None
    scheduler: str | None = None
    render_key: str | None = None
    reused: Reused | None = None
    handoff: Handoff | None = Field(None, exclude=True)

    @field_validator("outputs", "retries", mode="before")
    @classmethod
    def _none_is_empty(cls, value: Any) -> Any:
        return [] if value is None else value

    @field_validator("attempts", mode="before")
    @classmethod
    def _none_is_one(cls, value: Any) -> Any:
        return 1 if value is None else value

    @property
    def done(self) -> bool:
        return self.status == "done"

    @property
    def video(self) -> str | None:
        """The record's video output (its first .mp4), relative to the output folder."""
        return next((o for o in self.outputs if o.lower().endswith(".mp4")), None)

    def to_json(self) -> dict[str, Any]:
        """The manifest line's object: every field under its JSON key (schema first), extras as they are."""
        return self.model_dump(by_alias=True)  # python mode: a NaN stays a NaN, which append refuses

    @classmethod
    def from_json(cls, data: Any) -> ManifestRecord:
        """A record from a manifest line's object, of any known schema version (upgraded to the
        current one); ValueError (a ValidationError for a field) when it is not a usable record."""
        if not isinstance(data, Mapping):
            raise ValueError(f"a JSON {type(data).__name__}, not a record")
        return cls.model_validate(_upgrade(dict(data)))

    def replace(self, **fields: Any) -> ManifestRecord:
        """A copy with `fields` changed (validated); the handoff goes along unless given."""
        data = {**self.model_dump(), "handoff": self.handoff, **fields}
        return type(self).model_validate(data)

    # --- the JSON line's values, read like a dict --------------------------------------------

    def __getitem__(self, key: str) -> Any:
        if key == "schema":
            return self.schema_version
        if key in type(self).model_fields and key not in ("handoff", "schema_version"):
            return copy.deepcopy(getattr(self, key))  # a copy: the view cannot change the record
        extra = self.__pydantic_extra__ or {}
        if key in extra:
            return copy.deepcopy(extra[key])
        raise KeyError(key)

    def get(self, key: str, default: Any = None) -> Any:
        try:
            return self[key]
        except KeyError:
            return default

    def keys(self) -> list[str]:
        return list(self.to_json())

    def __contains__(self, key: object) -> bool:
        return key in self.keys()

    def __iter__(self) -> Iterator[str]:  # type: ignore[override]  (the line's keys, as a dict's)
        return iter(self.keys())

    def __len__(self) -> int:
        return len(self.keys())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Mapping):  # a JSON line read back (json.loads) equals its record
            return self.to_json() == dict(other)
        return super().__eq__(other)

    __hash__ = None  # type: ignore[assignment]  (mutable, as pydantic models are)


def _upgrade(data: dict[str, Any]) -> dict[str, Any]:
    """A line's object in the current schema: v1 (no "schema" key) -> v2 adds the key."""
    version = data.get("schema", 1)
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise ValueError(f"field schema: not a schema version (got {version!r})")
    if version > SCHEMA_VERSION:
        raise ValueError(f"schema {version}: written by a newer sagevideo (this one reads up to {SCHEMA_VERSION})")
    # v1 -> v2: the same fields; the version is written from v2 on.
    return {**data, "schema": SCHEMA_VERSION}


def newer_schema(data: Any) -> int | None:
    """The schema of a line's object when it is newer than this version's, else None."""
    version = data.get("schema") if isinstance(data, Mapping) else None
    if isinstance(version, int) and not isinstance(version, bool) and version > SCHEMA_VERSION:
        return version
    return None


def as_record(record: ManifestRecord | Mapping[str, Any]) -> ManifestRecord:
    """A ManifestRecord from a record or a mapping of its JSON keys (any known schema)."""
    return record if isinstance(record, ManifestRecord) else ManifestRecord.from_json(record)


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
    try:
        ManifestRecord.from_json(record)
    except ValidationError as err:
        e = err.errors()[0]
        field = ".".join(str(part) for part in e["loc"]) or "record"
        return f"field {field}: {e['msg']} (got {e.get('input')!r})"[:200]
    except ValueError as err:
        return str(err)[:200]
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
        self.newer: list[tuple[int, int]] = []  # (line number, schema) of lines a newer version wrote

    def records(self) -> list[ManifestRecord]:
        """Every usable record in file order; the other lines are listed in `bad_lines`."""
        self.bad_lines, self.newer = [], []
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
                try:
                    records.append(ManifestRecord.from_json(record))
                except ValueError:
                    self.bad_lines.append(BadLine(number, line.rstrip("\n"), record_problem(record) or "not a record"))
                    version = newer_schema(record)
                    if version is not None:
                        self.newer.append((number, version))
        return records

    def newer_schema_problem(self) -> str | None:
        """Why a run of this sagevideo must not write here (a line of a newer schema), or None."""
        from sagevideo.version import __version__

        self.records()
        if not self.newer:
            return None
        number, version = max(self.newer, key=lambda found: found[1])
        return (
            f"{self.path.name} line {number} was written by a newer sagevideo (manifest schema {version}; "
            f"this sagevideo {__version__} reads and writes schema {SCHEMA_VERSION}), so its jobs would be "
            "rendered again or overwritten; run the newer sagevideo on this folder, or give another --out"
        )

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

    def latest(self) -> dict[str, ManifestRecord]:
        """job_id -> its most recent record."""
        return {record.job_id: record for record in self.records()}

    def append(self, record: ManifestRecord | Mapping[str, Any]) -> None:
        """Append one record as one line, durably: the whole line or, on ManifestWriteError, none of it.
        A mapping is read as a record's JSON object first (ValueError when it is not one)."""
        data = as_record(record).to_json()
        line = (json.dumps(data, ensure_ascii=False, allow_nan=False) + "\n").encode("utf-8")
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


def is_done(record: ManifestRecord | Mapping[str, Any] | None, out_dir: Path) -> bool:
    """True when a record says done and all its outputs (files, and a PNG frames folder) exist in `out_dir`."""
    if record is None or (isinstance(record, Mapping) and not record):
        return False
    if isinstance(record, Mapping):  # a record's JSON object (scripts, tests)
        status, outputs = record.get("status"), record.get("outputs") or []
    else:
        status, outputs = record.status, record.outputs
    return status == "done" and bool(outputs) and all((out_dir / rel).exists() for rel in outputs)


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")
