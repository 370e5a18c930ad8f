"""Benchmark results: one JSON Lines file, one measured number per line.

Each line is a `Result` and must validate against `results.schema.json` beside this module (JSON
Schema draft 2020-12, the documented contract; `validate` checks the parts of it the schema uses,
so writing rows needs no jsonschema). A row is identified by (source, bench, shape, variant,
metric); a variant's parameters are written into it as ``name[key=value,...]`` (`variant`).

A run builds its rows on a `Run` (bench, gpu, commit, date and source shared by the run's rows,
`start_run`) and appends them (`append`: all validated first, nothing written if one is bad, no
row twice). `sagevideo bench attention|forward --append-results FILE` writes its report's rows
so; the repository's `bench/` scripts do the same into `bench/results.jsonl`. Read rows with
`load`, `select`, `one`; `speedup` gives a ratio to the same run's baseline.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import re
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

SCHEMA = Path(__file__).resolve().parent / "results.schema.json"
COMMIT_ENV = "BENCH_COMMIT"
SETTINGS_PREFIX = "TORCHINDUCTOR_"  # environment settings a run's source names (see start_run)

# The order fields are written in.
_FIELDS = ("bench", "shape", "variant", "metric", "value", "unit", "gpu", "commit", "date", "source", "extra")


@dataclass(frozen=True)
class Result:
    bench: str
    shape: str
    variant: str
    metric: str
    value: float
    gpu: str
    date: str
    source: str
    commit: str | None = None
    unit: str | None = None
    extra: dict[str, Any] = field(default_factory=dict, hash=False)

    def to_dict(self) -> dict[str, Any]:
        """The JSON row: `unit` and `extra` only when set, `commit` always (null when unknown)."""
        row = {name: getattr(self, name) for name in _FIELDS}
        if self.unit is None:
            del row["unit"]
        if not self.extra:
            del row["extra"]
        return row

    @classmethod
    def from_dict(cls, row: dict[str, Any]) -> Result:
        validate(row)
        return cls(**{**row, "value": float(row["value"])})


@cache
def schema() -> dict[str, Any]:
    """The row schema (results.schema.json)."""
    return json.loads(SCHEMA.read_text(encoding="utf-8"))


_TYPES = {"object": (dict,), "string": (str,), "number": (int, float), "null": (type(None),)}


def _schema_problems(row: Any) -> list[str]:
    """Where `row` breaks the schema's rules: an object, its required and only its named fields,
    each of its field's type(s), pattern, minLength and date format."""
    rules = schema()
    if not isinstance(row, dict):
        return ["(row): not a JSON object"]
    problems = [f"(row): {name!r} is a required property" for name in rules["required"] if name not in row]
    problems += [f"(row): additional property {name!r} is not allowed" for name in row
                 if name not in rules["properties"]]
    for name, value in row.items():
        rule = rules["properties"].get(name)
        if rule is None:
            continue
        types = rule["type"] if isinstance(rule["type"], list) else [rule["type"]]
        if isinstance(value, bool) or not isinstance(value, tuple(t for kind in types for t in _TYPES[kind])):
            problems.append(f"{name}: {value!r} is not of type {' or '.join(types)}")
        elif isinstance(value, str):
            if len(value) < rule.get("minLength", 0):
                problems.append(f"{name}: {value!r} is too short")
            if "pattern" in rule and not re.search(rule["pattern"], value):
                problems.append(f"{name}: {value!r} does not match {rule['pattern']!r}")
            if rule.get("format") == "date":
                try:
                    datetime.date.fromisoformat(value)
                except ValueError:
                    problems.append(f"{name}: {value!r} is not a 'date'")
    return sorted(problems)


def validate(row: dict[str, Any]) -> None:
    """Raise ValueError naming every way `row` breaks the schema (or has a non-finite value)."""
    problems = _schema_problems(row)
    value = row.get("value") if isinstance(row, dict) else None
    if isinstance(value, float) and not math.isfinite(value):
        problems.append(f"value: {value} is not finite")
    if problems:
        raise ValueError("not a valid result row: " + "; ".join(problems))


def load(path: str | Path) -> list[Result]:
    """Every row of a results file, validated; a bad line raises ValueError with its line number."""
    results = []
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            results.append(Result.from_dict(json.loads(line)))
        except (ValueError, TypeError) as error:  # json.JSONDecodeError is a ValueError
            raise ValueError(f"{path}:{number}: {error}") from error
    return results


def _key(row: dict[str, Any]) -> tuple:
    return tuple(row.get(name) for name in ("source", "bench", "shape", "variant", "metric"))


def append(results: Iterable[Result], path: str | Path) -> int:
    """Validate every row, then append them all (nothing is written if one is invalid).

    A row whose identity (source, bench, shape, variant, metric) is already in the file, or twice
    in `results`, is refused too: a row names one measured number.
    """
    path = Path(path)
    rows = [result.to_dict() for result in results]
    for row in rows:
        validate(row)
    seen = set()
    if path.exists():
        seen = {_key(json.loads(line)) for line in path.read_text().splitlines() if line.strip()}
    for row in rows:
        if _key(row) in seen:
            raise ValueError(f"not a new result row: (source, bench, shape, variant, metric) = {_key(row)} "
                             f"is already in {path} or twice in the rows")
        seen.add(_key(row))
    lines = [json.dumps(row, ensure_ascii=False, allow_nan=False, separators=(",", ":")) + "\n" for row in rows]
    with path.open("a") as f:
        f.writelines(lines)
    return len(lines)


def variant(name: str, **params: Any) -> str:
    """A variant with its parameters, as the file writes them: name[key=value,...] (None -> auto,
    booleans -> on/off); the bare name without parameters."""
    def fmt(x: Any) -> str:
        if x is None:
            return "auto"
        if isinstance(x, bool):
            return "on" if x else "off"
        return str(x)

    inner = ",".join(f"{key}={fmt(value)}" for key, value in params.items())
    return f"{name}[{inner}]" if inner else name


def current_commit(root: Path | None = None) -> tuple[str | None, bool]:
    """(the checkout's commit, whether tracked files differ from it): $BENCH_COMMIT when set (the GPU
    machine's copy has no .git; it is then taken as clean), else `git rev-parse HEAD`, else None."""
    given = os.environ.get(COMMIT_ENV)
    if given:
        if not re.fullmatch(r"[0-9a-f]{7,40}", given):
            raise ValueError(f"{COMMIT_ENV}={given!r}: 7 to 40 lowercase hex digits (git rev-parse HEAD)")
        return given, False

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    root = root or Path(__file__).resolve().parents[3]  # the checkout this package runs from, if any
    head = git("rev-parse", "HEAD")
    if not head:
        return None, False
    return head, bool(git("status", "--porcelain", "--untracked-files=no"))


@dataclass
class Run:
    """The rows of one benchmark run: `add` them, then `append` them to the results file.

    bench, gpu, commit, date and source are the same for every row (a row may name another commit:
    an A/B's base side). `source` says which run it was: when it started (UTC) and its command line.
    """

    bench: str
    gpu: str
    commit: str | None
    date: str
    source: str
    rows: list[Result] = field(default_factory=list)

    def add(self, shape: str, variant: str, metric: str, value: Any, *, unit: str | None = None,
            commit: str | None = "run", **extra: Any) -> None:
        """One measured number. A None value is no row (not measured); booleans become 0/1 (unit
        bool); a NaN becomes `METRIC_is_nan` = 1 (JSON has no NaN). Empty extras are left out."""
        if value is None:
            return
        if isinstance(value, bool):
            value, unit = float(value), unit or "bool"
        if isinstance(value, float) and math.isnan(value):
            metric, value, unit = f"{metric}_is_nan", 1.0, "bool"
        extra = {key: x for key, x in extra.items() if x not in (None, {}, [])}
        self.rows.append(Result(bench=self.bench, shape=str(shape), variant=variant, metric=metric,
                                value=float(value), gpu=self.gpu, date=self.date, source=self.source,
                                commit=self.commit if commit == "run" else commit, unit=unit, extra=extra))

    def append(self, path: str | Path) -> int:
        return append(self.rows, path)


def gpu_name(count: int = 1) -> str:
    """torch.cuda.get_device_name(), prefixed by the count when the run used several ("2x NVIDIA H200")."""
    import torch

    name = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    return f"{count}x {name}" if count > 1 else name


def select(results: Iterable[Result], **where: Any) -> list[Result]:
    """The rows whose fields equal every keyword given, e.g. select(rows, bench="bench_sm90", metric="tops")."""
    unknown = set(where) - set(_FIELDS)
    if unknown:
        raise TypeError(f"select() got unknown fields {sorted(unknown)}; fields are {', '.join(_FIELDS)}")
    return [r for r in results if all(getattr(r, name) == value for name, value in where.items())]


def one(results: Iterable[Result], **where: Any) -> Result:
    """The single row matching `where`; LookupError if none or several match."""
    found = select(results, **where)
    if len(found) != 1:
        raise LookupError(f"{len(found)} rows match {where}")
    return found[0]


def speedup(results: Iterable[Result], result: Result, baseline: str = "sdpa-cudnn") -> float:
    """`baseline`'s time over `result`'s (both `ms`, same source, bench and shape).

    This is how the legacy files' `vs_cudnn` ratios are read: they are not stored where they equal it.
    """
    base = one(results, source=result.source, bench=result.bench, shape=result.shape, variant=baseline,
               metric=result.metric)
    return base.value / result.value


def start_run(bench: str, gpu: str, command: str, *, root: Path | None = None,
              now: datetime.datetime | None = None) -> Run:
    """A `Run` of `bench` on `gpu` now, at this checkout's commit (`current_commit`); its source is
    "START_UTC [SETTINGS] COMMAND" (" (uncommitted changes)" added when tracked files differ);
    SETTINGS: the environment's Inductor settings (TORCHINDUCTOR_*=...), which change the compiled
    code a figure measures."""
    now = now or datetime.datetime.now(datetime.timezone.utc)
    commit, dirty = current_commit(root)
    settings = "".join(f"{k}={v} " for k, v in sorted(os.environ.items()) if k.startswith(SETTINGS_PREFIX))
    source = f"{now:%Y-%m-%dT%H:%M:%SZ} {settings}{command}".rstrip()
    if dirty:
        source += " (uncommitted changes)"
    return Run(bench=bench, gpu=gpu, commit=commit, date=f"{now:%Y-%m-%d}", source=source)
