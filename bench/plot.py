"""Plot one run's times from the results file as speed-ups over a baseline variant.

    python -m bench.plot --source 2026-12-01-h200-ab-final.json --baseline "cudnn[pv=fp8]" --out ab.png
    python -m bench.plot --list                     # the sources in the file, newest first

One group of bars per shape, one bar per variant: baseline's `ms` over the variant's `ms` of the
same source, bench and shape (above 1: faster than the baseline). The figure says the GPU, the
date and the commit the rows carry.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

from bench.results import DEFAULT, Result, load


def speedups(rows: list[Result], baseline: str, metric: str = "ms") -> dict[str, dict[str, float]]:
    """{shape: {variant: baseline's value / variant's value}} for the rows of one source."""
    by_shape: dict[str, dict[str, float]] = defaultdict(dict)
    for row in rows:
        if row.metric == metric:
            by_shape[row.shape][row.variant] = row.value
    out = {}
    for shape, values in by_shape.items():
        if baseline in values:
            out[shape] = {variant: values[baseline] / value for variant, value in values.items() if variant != baseline}
    if not out:
        variants = sorted({row.variant for row in rows if row.metric == metric})
        raise ValueError(f"no shape has the baseline {baseline!r}; variants here: {variants}")
    return out


def plot(ratios: dict[str, dict[str, float]], title: str, out: Path, baseline: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shapes = list(ratios)
    variants = sorted({v for per in ratios.values() for v in per})
    width = 0.8 / max(len(variants), 1)
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(shapes)), 4))
    for i, variant in enumerate(variants):
        xs = [s + (i - (len(variants) - 1) / 2) * width for s in range(len(shapes))]
        ax.bar(xs, [ratios[shape].get(variant, 0.0) for shape in shapes], width, label=variant)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(shapes)), shapes, rotation=20, ha="right")
    ax.set_ylabel(f"speed-up over {baseline}")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.plot", description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, default=DEFAULT)
    parser.add_argument("--source", help="the run to plot (its `source`)")
    parser.add_argument("--baseline", default="sdpa-cudnn", help="the variant others are compared with")
    parser.add_argument("--metric", default="ms")
    parser.add_argument("--out", type=Path, default=Path("speedups.png"))
    parser.add_argument("--list", action="store_true", help="list the sources, newest first")
    args = parser.parse_args(argv)
    rows = load(args.results)
    if args.list:
        dates: dict[str, str] = {}
        for row in rows:
            dates.setdefault(row.source, row.date)
        for source, date in sorted(dates.items(), key=lambda item: item[1], reverse=True):
            print(f"{date}  {source}")
        return 0
    if not args.source:
        parser.error("give --source (see --list)")
    chosen = [row for row in rows if row.source == args.source]
    if not chosen:
        print(f"bench.plot: no rows with source {args.source!r} in {args.results} (see --list)", file=sys.stderr)
        return 2
    try:
        ratios = speedups(chosen, args.baseline, args.metric)
    except ValueError as error:
        print(f"bench.plot: {error}", file=sys.stderr)
        return 2
    first = chosen[0]
    title = f"{args.source}: {first.gpu}, {first.date}, commit {first.commit or 'unknown'}"
    plot(ratios, title, args.out, args.baseline)
    print(f"bench.plot: {len(ratios)} shapes -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
