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
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
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


def append(results: Iterable[Result], path: str | Path = DEFAULT) -> int:
    """Validate every row, then append them all (nothing is written if one is invalid)."""
    lines = []
    for result in results:
        row = result.to_dict()
        validate(row)
        lines.append(json.dumps(row, ensure_ascii=False, allow_nan=False, separators=(",", ":")) + "\n")
    with Path(path).open("a") as f:
        f.writelines(lines)
    return len(lines)


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
