"""The repository's results file, bench/results.jsonl, and the maintainer benchmarks' `--append-results`.

The rows, their schema, validation and the `Run` that builds them are the package's
(`sagevideo.experiments.bench.results`, which `sagevideo bench --append-results` uses too); this
module gives them this file as the default and the command line the scripts here share. It stays
out of the package: it names a file of this checkout.

Each line of `bench/results.jsonl` is a `Result` and must validate against
`sagevideo/experiments/bench/results.schema.json` (JSON Schema draft 2020-12, the documented contract). A row is
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
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from sagevideo.experiments.bench import results as _results
from sagevideo.experiments.bench.results import (  # noqa: F401  (this module's public face, as before)
    COMMIT_ENV,
    SCHEMA,
    SETTINGS_PREFIX,
    Result,
    Run,
    append,
    current_commit,
    gpu_name,
    speedup,
    validate,
    variant,
)

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DEFAULT = HERE / "results.jsonl"


def load(path: str | Path = DEFAULT) -> list[Result]:
    """Every row of a results file (this checkout's by default), validated."""
    return _results.load(path)


def select(results: Iterable[Result] | None = None, **where: Any) -> list[Result]:
    """`sagevideo.experiments.bench.results.select` on `results`, this checkout's rows by default."""
    return _results.select(load() if results is None else results, **where)


def one(results: Iterable[Result] | None = None, **where: Any) -> Result:
    """The single row matching `where` (this checkout's rows by default); LookupError otherwise."""
    return _results.one(load() if results is None else results, **where)


def start_run(bench: str, gpu: str, argv: Sequence[str] | None = None, *, root: Path = ROOT,
              now: datetime.datetime | None = None) -> Run:
    """A `Run` of the script bench/BENCH.py: its source's command is "python -m bench.BENCH ARGS"."""
    args = " ".join(sys.argv[1:] if argv is None else argv)
    return _results.start_run(bench, gpu, f"python -m bench.{bench} {args}".rstrip(), root=root, now=now)


def add_results_option(parser: argparse.ArgumentParser) -> None:
    """`--append-results [PATH]`: append the run's rows to PATH (bench/results.jsonl without one)."""
    parser.add_argument("--append-results", nargs="?", const=DEFAULT, type=Path, metavar="PATH",
                        help=f"append this run's rows to PATH, validated (default {DEFAULT.relative_to(ROOT)}; "
                             f"on a machine without .git set {COMMIT_ENV})")


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
