"""Benchmark results: one JSON Lines file, one measured number per line.

Each line of `bench/results.jsonl` is a `Result` and must validate against
`bench/results.schema.json` (JSON Schema draft 2020-12, the documented contract). A row is
identified by (source, bench, shape, variant, metric); a variant's parameters are written into
the variant as ``name[key=value,...]``.

    from bench.results import load, select, one

    rows = load()
    one(rows, source="2026-11-30-h200-final7-bench.json", shape="cogvideox-2b",
        variant="sage-fp8-call", metric="tops").value          # 575.49
    select(rows, bench="bench_ab_commit", metric="ms")         # every A/B timing

A maintained benchmark adds its run with `--append-results [PATH]` (`add_results_option`; default
this file): it builds its rows on a `Run` (bench, gpu, commit, date and source shared by the run's
rows) and appends them. On the GPU machine, whose copy of the checkout has no .git, give the commit
as BENCH_COMMIT=$(git rev-parse HEAD) and append to a file under $OUT; here, move those rows into
this file with `python -m bench.results add RUN.jsonl`.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import re
import subprocess
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DEFAULT = HERE / "results.jsonl"
SCHEMA = HERE / "results.schema.json"

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
def _validator():
    import jsonschema  # in the dev environment (ray depends on it)

    schema = json.loads(SCHEMA.read_text())
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


def validate(row: dict[str, Any]) -> None:
    """Raise ValueError naming every way `row` breaks the schema (or has a non-finite value)."""
    problems = [
        f"{'/'.join(map(str, error.absolute_path)) or '(row)'}: {error.message}"
        for error in sorted(_validator().iter_errors(row), key=lambda e: list(map(str, e.absolute_path)))
    ]
    value = row.get("value")
    if isinstance(value, float) and not math.isfinite(value):
        problems.append(f"value: {value} is not finite")
    if problems:
        raise ValueError("not a valid result row: " + "; ".join(problems))


def load(path: str | Path = DEFAULT) -> list[Result]:
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


def append(results: Iterable[Result], path: str | Path = DEFAULT) -> int:
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


COMMIT_ENV = "BENCH_COMMIT"


def current_commit(root: Path = ROOT) -> tuple[str | None, bool]:
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

    def append(self, path: str | Path = DEFAULT) -> int:
        return append(self.rows, path)


SETTINGS_PREFIX = "TORCHINDUCTOR_"  # environment settings a run's source names (see start_run)


def start_run(bench: str, gpu: str, argv: Sequence[str] | None = None, *, root: Path = ROOT,
              now: datetime.datetime | None = None) -> Run:
    """A `Run` of `bench` on `gpu` now, at this checkout's commit (`current_commit`); its source is
    "START_UTC [SETTINGS] python -m bench.BENCH ARGS" (" (uncommitted changes)" added when tracked
    files differ); SETTINGS: the environment's Inductor settings (TORCHINDUCTOR_*=...), which change
    the compiled code a figure measures."""
    now = now or datetime.datetime.now(datetime.timezone.utc)
    commit, dirty = current_commit(root)
    args = " ".join(sys.argv[1:] if argv is None else argv)
    settings = "".join(f"{k}={v} " for k, v in sorted(os.environ.items()) if k.startswith(SETTINGS_PREFIX))
    source = f"{now:%Y-%m-%dT%H:%M:%SZ} {settings}python -m bench.{bench} {args}".rstrip()
    if dirty:
        source += " (uncommitted changes)"
    return Run(bench=bench, gpu=gpu, commit=commit, date=f"{now:%Y-%m-%d}", source=source)


def add_results_option(parser: argparse.ArgumentParser) -> None:
    """`--append-results [PATH]`: append the run's rows to PATH (bench/results.jsonl without one)."""
    parser.add_argument("--append-results", nargs="?", const=DEFAULT, type=Path, metavar="PATH",
                        help=f"append this run's rows to PATH, validated (default {DEFAULT.relative_to(ROOT)}; "
                             f"on a machine without .git set {COMMIT_ENV})")


def gpu_name(count: int = 1) -> str:
    """torch.cuda.get_device_name(), prefixed by the count when the run used several ("2x NVIDIA H200")."""
    import torch

    name = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    return f"{count}x {name}" if count > 1 else name


def select(results: Iterable[Result] | None = None, **where: Any) -> list[Result]:
    """The rows whose fields equal every keyword given, e.g. select(rows, bench="bench_sm90", metric="tops").

    `results` defaults to the rows of `DEFAULT`.
    """
    unknown = set(where) - set(_FIELDS)
    if unknown:
        raise TypeError(f"select() got unknown fields {sorted(unknown)}; fields are {', '.join(_FIELDS)}")
    rows = load() if results is None else results
    return [r for r in rows if all(getattr(r, name) == value for name, value in where.items())]


def one(results: Iterable[Result] | None = None, **where: Any) -> Result:
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


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.results",
                                     description="Add the rows of run files (a GPU machine's --append-results "
                                                 "output) to the results file.")
    sub = parser.add_subparsers(dest="command", required=True)
    add = sub.add_parser("add", help="validate RUN files and append their rows")
    add.add_argument("runs", nargs="+", type=Path, metavar="RUN")
    add.add_argument("--to", type=Path, default=DEFAULT, help=f"results file (default {DEFAULT.relative_to(ROOT)})")
    args = parser.parse_args(argv)
    try:
        rows = [row for run in args.runs for row in load(run)]
        added = append(rows, args.to)
    except (OSError, ValueError) as error:
        print(f"bench.results: {error}", file=sys.stderr)
        return 2
    print(f"bench.results: {added} rows added to {args.to}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
