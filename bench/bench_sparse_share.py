#!/usr/bin/env python3
"""The device tile selection's share of a dynamic block-sparse call, at a real shape.

On planted-structure inputs (`eval/numerics/planted.py`; random inputs are not self-similar, so the
selection keeps every tile of them), the selection keeps the target density: with `--rule top-p` (the
default) one top_p for the whole call, chosen by bisection (calibrated plans' rule); with `--rule per-row`
each query tile's count at that density with the probe sized by the key tiles (`attention.sparse.
dynamic_selection`, what installed dynamic plans pass). Then, side by side in one process (median of
interleaved rounds, CUDA events):

- `dense`: `sageattn` without a tile mask;
- `lists`: `sageattn(tile_mask=lists)` with the selection's lists computed beforehand;
- `select+attend`: `sageattn(tile_mask=DynamicSelection(top_p))`, the one op that pools, selects and attends;
- `select`: `attention.sparse.select_tile_lists` alone (quantization with pooling, scores, selection).

share = (select+attend - lists) / select+attend: what choosing the tiles adds to the call, in wall
time. On a GPU the same in device time too (`device_share`, from torch.profiler: 3 calls of each arm
per round, the rounds interleaved, each kernel's median over the rounds; the kernels' time alone,
whatever the host does between calls): the kernels the selection adds or lengthens
(`select_kernels_ms`, per call) over the select+attend call's kernels. The attention kernel itself
is left out of what is added: both arms attend over the same selection's lists, and its time drifts between
rounds by more than a selection kernel takes (about 1 ms of 20 for identical lists at Wan 720p FP8
on an H100); its two medians are in `attention_ms`.

    python -m bench.bench_sparse_share --shape wan-720p --pv fp8 --density 0.15 [--probe-columns 8]
    python -m bench.bench_sparse_share --shape wan-720p --pv fp8 --pv fp16 --density 0.15 --rule per-row \
        --append-results   # the rows into bench/results.jsonl (`result_rows`)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

if not __package__:  # run as a file: `bench` from the repo root, as with -m
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.bench_sparse_select import SHAPES, cell_for  # noqa: E402
from bench.results import add_results_option, gpu_name, start_run  # noqa: E402


def top_p_for_density(q, k, density: float, pv: str, sm_scale: float, steps: int = 14,
                      probe_columns: int = 0) -> tuple[float, object]:
    """The top_p whose device selection keeps about `density` of the tiles, by bisection (host loop)."""
    from sagevideo.attention.sparse import select_tile_lists
    from sagevideo.kernels.tile_select import DynamicSelection

    low, high = 0.0, 1.0
    best = None
    for _ in range(steps):
        middle = (low + high) / 2
        lists = select_tile_lists(q, k, DynamicSelection(top_p=middle, probe_columns=probe_columns), pv=pv,
                                  sm_scale=sm_scale)
        if best is None or abs(lists.density - density) < abs(best[1].density - density):
            best = (middle, lists)
        if lists.density > density:
            high = middle
        else:
            low = middle
    return best


def device_kernels(fn, calls: int = 3) -> dict[str, float]:
    """{kernel name: device ms per call} of fn over `calls` calls, after one warm-up call
    (torch.profiler's CUDA activity)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    return {event.key: event.device_time_total / 1e3 / calls for event in prof.key_averages()}


def median_kernels(runs: list[dict[str, float]]) -> dict[str, float]:
    """Each kernel's median over the runs (0 in a run that did not launch it)."""
    from sagevideo.experiments.bench.timing import median

    names = {name for run in runs for name in run}
    return {name: median([run.get(name, 0.0) for run in runs]) for name in names}


def run(shape_name: str, density: float, pv: str, rounds: int, device: str = "cuda", probe_columns: int = 0,
        rule: str = "top-p") -> dict:
    import torch

    from sagevideo import sageattn
    from sagevideo.attention.sparse import dynamic_selection, key_tiles_of, select_tile_lists
    from sagevideo.eval.numerics.planted import PlantedSpec, planted_inputs
    from sagevideo.experiments.bench.timing import median, median_ms
    from sagevideo.kernels.plans import tiles
    from sagevideo.kernels.tile_select import DynamicSelection, grid_tile_order

    batch, heads, grid, head_dim, prefix, suffix = SHAPES[shape_name]
    block_m, block_n = tiles(pv, head_dim)
    spec = PlantedSpec(batch, heads, *grid, head_dim, text_prefix=prefix, text_suffix=suffix)
    inputs = planted_inputs(spec, order=grid_tile_order(*grid, *cell_for(max(block_m, block_n))), device=device)
    q, k, v = (t.to(torch.bfloat16) for t in (inputs.q, inputs.k, inputs.v))
    scale = inputs.sm_scale
    if rule == "per-row":
        top_p, selection = None, dynamic_selection(density, key_tiles=key_tiles_of(k, pv))
        lists = select_tile_lists(q, k, selection, pv=pv, sm_scale=scale)
    else:
        top_p, lists = top_p_for_density(q, k, density, pv, scale, probe_columns=probe_columns)
        selection = DynamicSelection(top_p=top_p, probe_columns=probe_columns)
    arms = {
        "dense": lambda: sageattn(q, k, v, pv=pv, sm_scale=scale),
        "lists": lambda: sageattn(q, k, v, pv=pv, sm_scale=scale, tile_mask=lists),
        "select+attend": lambda: sageattn(q, k, v, pv=pv, sm_scale=scale, tile_mask=selection),
        "select": lambda: select_tile_lists(q, k, selection, pv=pv, sm_scale=scale),
    }
    times: dict[str, list[float]] = {name: [] for name in arms}
    for _ in range(rounds):
        for name, fn in arms.items():
            times[name].append(median_ms(fn, device, budget_ms=200))
    ms = {name: median(values) for name, values in times.items()}
    row = {"shape": shape_name, "q": list(q.shape), "pv": pv, "target": density, "density": round(lists.density, 4),
           "rule": rule, "top_p": None if top_p is None else round(top_p, 5), "tiles": f"{block_m}x{block_n}",
           "probe_columns": selection.probe_columns,
           "device": torch.cuda.get_device_name() if device == "cuda" else device,
           "ms": {name: round(value, 3) for name, value in ms.items()},
           "share": round((ms["select+attend"] - ms["lists"]) / ms["select+attend"], 4),
           "select_over_call": round(ms["select"] / ms["select+attend"], 4),
           "x_dense": round(ms["dense"] / ms["select+attend"], 3)}
    if device == "cuda":
        runs: dict[str, list[dict[str, float]]] = {"lists": [], "select+attend": []}
        for _ in range(rounds):
            for name in runs:
                runs[name].append(device_kernels(arms[name]))
        lists_kernels, both_kernels = (median_kernels(runs[name]) for name in runs)
        attention = max(lists_kernels, key=lists_kernels.get)  # the lists arm's largest kernel
        added = {name: ms - lists_kernels.get(name, 0.0) for name, ms in both_kernels.items() if name != attention}
        both_ms = sum(both_kernels.values())
        row["device_ms"] = {"lists": round(sum(lists_kernels.values()), 3), "select+attend": round(both_ms, 3)}
        row["attention_ms"] = {"kernel": attention, "lists": round(lists_kernels[attention], 3),
                               "select+attend": round(both_kernels.get(attention, 0.0), 3)}
        row["device_share"] = round(sum(added.values()) / both_ms, 4)
        row["select_kernels_ms"] = {name: round(ms, 3) for name, ms in sorted(added.items(), key=lambda kv: -kv[1])
                                    if ms > 0.01}
    return row


def result_rows(results, rows: list[dict]) -> None:
    """Each run row as results-file rows on `results` (a `bench.results.Run`): variant
    "PV[rule=...,target=...,probe_columns=...]", metrics density, share, select_over_call, x_dense,
    the arms' ms (select+attend as select_and_attend), and on a GPU device_share with the arms'
    device ms and each added kernel's ms."""
    for row in rows:
        settings = f"rule={row['rule']},target={row['target']},probe_columns={row['probe_columns']}"
        where = (row["shape"], f"{row['pv']}[{settings}]")
        results.add(*where, "density", row["density"], top_p=row["top_p"], tiles=row["tiles"])
        for metric in ("share", "select_over_call", "x_dense"):
            results.add(*where, metric, row[metric])
        for arm, ms in row["ms"].items():
            results.add(*where, f"{_metric(arm)}_ms", ms, unit="ms")
        if "device_share" in row:
            results.add(*where, "device_share", row["device_share"], kernels_ms=row["select_kernels_ms"])
            for arm, ms in row["device_ms"].items():
                results.add(*where, f"device_{_metric(arm)}_ms", ms, unit="ms")


def _metric(arm: str) -> str:
    return arm.replace("+", "_and_")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="wan-720p")
    parser.add_argument("--density", type=float, action="append", help="target density (repeatable; default 0.15)")
    parser.add_argument("--pv", choices=("fp16", "fp8"), action="append", help="P·V mode (repeatable; default fp8)")
    parser.add_argument("--device", default="cuda", help="cpu: a smoke run of the script (the PyTorch selection)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (the median is reported)")
    parser.add_argument("--probe-columns", type=int, default=0,
                        help="key tiles per head the exact probe forces (DynamicSelection.probe_columns; 0: off)")
    parser.add_argument("--rule", choices=("top-p", "per-row"), default="top-p",
                        help="one top_p for the call (bisected to the density), or the installed per-row density "
                             "(its probe sized by the key tiles; --probe-columns is then ignored)")
    parser.add_argument("--json", type=Path, default=None, help="write the rows as JSON here")
    add_results_option(parser)
    args = parser.parse_args(argv)
    rows = []
    for pv in args.pv or ["fp8"]:
        for density in args.density or [0.15]:
            rows.append(run(args.shape, density, pv, args.rounds, args.device, args.probe_columns, args.rule))
            row = rows[-1]
            rule = f"top_p {row['top_p']}" if row["top_p"] is not None else "per-row"
            print(f"{row['shape']} pv={pv} probe {row['probe_columns']} density {row['density']:.3f} ({rule}): "
                  + "  ".join(f"{name} {value:.2f} ms" for name, value in row["ms"].items())
                  + f"  | selection share {row['share']:.1%}, select alone {row['select_over_call']:.1%} of the call, "
                  f"{row['x_dense']:.2f}x dense", flush=True)
            if "device_share" in row:
                attention = row["attention_ms"]
                print(f"  device time: lists {row['device_ms']['lists']:.2f} ms, select+attend "
                      f"{row['device_ms']['select+attend']:.2f} ms (attention kernel {attention['lists']:.2f} / "
                      f"{attention['select+attend']:.2f}): selection share {row['device_share']:.1%}; "
                      "added per call: " + ", ".join(f"{k[:40]} {v:.2f}" for k, v in row["select_kernels_ms"].items()),
                      flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    if args.append_results:
        results = start_run("bench_sparse_share", gpu_name() if args.device.startswith("cuda") else "cpu", argv)
        result_rows(results, rows)
        results.append(args.append_results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
