#!/usr/bin/env python3
"""What block-sparse tile selection keeps of attention with planted structure, per density.

For each density, the dynamic selection (`tile_select.select_dynamic_at_density`: pooled Q/K tile
scores, one top-p for every head, found by bisection with host reads), the same scores at a per-row
density ("dynamic-rows", `TileScores.keep_per_row`: each query tile keeps its forced tiles and its
most probable others up to ceil(density x its key tiles); what installed models run, no host read),
with `--probe-columns N` also that per-row density with N key tiles per head forced by the exact
probe ("dynamic-rows-probe", `DynamicSelection.probe_columns`), and the static one
(`select_static_at_density`: the 3-D window on the latent grid closest to the density) on planted
inputs (`eval/numerics/planted.py`: 3-D local windows, temporal stripes, sinks, global tokens),
video tokens in the grid's cell order (`grid_tile_order`). Reported, exact in fp64 against dense
attention: the attention mass the kept tiles hold (mean, worst query row, worst head) and the output
cosine of attention restricted to the mask (worst and mean over heads). The selection's tiles are
the kernel plan's (`plans.tiles`).

CPU at small sizes, GPU at the real ones (the fp64 passes are minutes there):

    python -m bench.bench_sparse_select --shape small                       # CPU, seconds
    python -m bench.bench_sparse_select --shape wan-720p --device cuda --json OUT.json
    python -m bench.bench_sparse_select --shape wan-720p --heads 8 --device cuda  # a head subset
    python -m bench.bench_sparse_select --shape small --max-spread 1.9      # key tiles where one key stands out kept
    python -m bench.bench_sparse_select --shape wan-720p --heads 8 --device cuda --densities 0.15 --probe-columns 8
    python -m bench.bench_sparse_select --shape small --probe-columns 1 --query-rows 128  # a list per 2 query tiles
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

if not __package__:  # run as a file: `bench` from the repo root, as with -m
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.results import add_results_option, gpu_name, start_run  # noqa: E402

# name -> (batch, heads, (frames, height, width), head dim, text prefix, text suffix)
SHAPES = {
    "small": (1, 2, (8, 16, 32), 64, 0, 0),
    "small-text": (1, 2, (8, 16, 32), 64, 100, 0),
    "medium": (1, 4, (16, 16, 32), 128, 0, 0),  # 8,192 tokens at d128: a minute or two on a CPU
    "wan-720p": (1, 40, (21, 45, 80), 128, 0, 0),
    "cogvideox-5b": (1, 48, (13, 30, 45), 64, 226, 0),  # 720x480x49 frames, 226 text tokens first
}
DENSITIES = (0.1, 0.15, 0.25, 0.5)


def cell_for(block: int) -> tuple[int, int, int]:
    """A (frames, rows, columns) cell of `block` tokens for the token order: 1x8x8 for 64, 2x8x8 for 128."""
    return {64: (1, 8, 8), 128: (2, 8, 8)}.get(block, (1, 1, block))


def run(shape_name: str, densities, *, device: str, heads: int | None, pv: str, global_tokens: int | None,
        seed: int, max_spread: float = math.inf, probe_columns: int = 0, query_rows: int | None = None) -> list[dict]:
    from sagevideo.eval.numerics.planted import PlantedSpec, planted_inputs, selection_quality
    from sagevideo.kernels.plans import tiles
    from sagevideo.kernels.tile_select import (
        grid_tile_order,
        select_dynamic_at_density,
        select_dynamic_per_row,
        select_static_at_density,
    )

    batch, all_heads, grid, head_dim, prefix, suffix = SHAPES[shape_name]
    plan_m, block_n = tiles(pv, head_dim)
    block_m = query_rows or plan_m  # the dynamic arms'; static windows take the plan's tiles
    extra = {} if global_tokens is None else {"global_tokens": global_tokens}
    spec = PlantedSpec(batch, heads or all_heads, *grid, head_dim, text_prefix=prefix, text_suffix=suffix, seed=seed,
                       **extra)
    order = grid_tile_order(*grid, *cell_for(max(block_m, block_n)))
    inputs = planted_inputs(spec, order=order, device=device)
    rows = []
    spread = None if math.isinf(max_spread) else max_spread  # JSON has no inf
    for density in densities:
        started = time.perf_counter()
        options = dict(block_m=block_m, block_n=block_n, sm_scale=inputs.sm_scale, dense_prefix=prefix,
                       dense_suffix=suffix, max_spread=max_spread)
        dynamic = select_dynamic_at_density(inputs.q, inputs.k, density, **options)
        selected = time.perf_counter() - started
        started = time.perf_counter()
        per_row = select_dynamic_per_row(inputs.q, inputs.k, density, **options)
        selected_rows = time.perf_counter() - started
        probed = {}
        if probe_columns:
            started = time.perf_counter()
            mask = select_dynamic_per_row(inputs.q, inputs.k, density, probe_columns=probe_columns, **options)
            probed["dynamic-rows-probe"] = (mask, {"select_s": round(time.perf_counter() - started, 3),
                                                   "max_spread": spread, "probe_columns": probe_columns})
        static, window = select_static_at_density(grid, density, block_m=plan_m, block_n=block_n, order=order,
                                                  dense_prefix=prefix, dense_suffix=suffix, sink_tiles=1,
                                                  device=device)
        arms = {"dynamic": (dynamic, {"select_s": round(selected, 3), "max_spread": spread}),
                "dynamic-rows": (per_row, {"select_s": round(selected_rows, 3), "max_spread": spread}),
                **probed, "static": (static, {"window": list(window)})}
        for name, (mask, detail) in arms.items():
            quality = selection_quality(inputs, mask)
            rows.append({"shape": shape_name, "heads": spec.heads, "tiles": f"{mask.block_m}x{mask.block_n}",
                         "selection": name, "target": density, **quality.as_dict(), **detail})
            print(_line(rows[-1]), flush=True)
    return rows


def _line(row: dict) -> str:
    return (f"{row['shape']:<11} {row['selection']:<12} target {row['target']:<5} density {row['density']:.3f}  "
            f"mass mean {row['mass_mean']:.4f} worst row {row['mass_worst_row']:.4f} "
            f"worst head {row['mass_worst_head']:.4f}  cos worst {row['cos_worst']:.4f} mean {row['cos_mean']:.4f}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="small")
    parser.add_argument("--densities", default=",".join(map(str, DENSITIES)))
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--heads", type=int, default=None, help="planted heads (default: the shape's)")
    parser.add_argument("--pv", choices=("fp16", "fp8"), default="fp8", help="the plan whose tiles select")
    parser.add_argument("--global-tokens", type=int, default=None, help="planted global keys (default: PlantedSpec's)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-spread", type=float, default=math.inf,
                        help="dynamic selection: keep the key tiles whose spread is above this (default: off)")
    parser.add_argument("--json", type=Path, default=None, help="write the rows as JSON here")
    parser.add_argument("--probe-columns", type=int, default=0,
                        help="also the per-row density with this many key tiles per head forced by the exact probe")
    parser.add_argument("--query-rows", type=int, default=None,
                        help="the query rows each dynamic selection decides for (default: the plan's BLOCK_M; 128 "
                             "with the FP8 plan's 64 is one list per pair of query tiles); static windows keep "
                             "the plan's tiles")
    add_results_option(parser)
    args = parser.parse_args(argv)
    densities = [float(d) for d in args.densities.split(",")]
    rows = run(args.shape, densities, device=args.device, heads=args.heads, pv=args.pv,
               global_tokens=args.global_tokens, seed=args.seed, max_spread=args.max_spread,
               probe_columns=args.probe_columns, query_rows=args.query_rows)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    if args.append_results:
        results = start_run("bench_sparse_select", gpu_name() if args.device.startswith("cuda") else "cpu", argv)
        for row in rows:
            spread = f",max_spread={row['max_spread']}" if row.get("max_spread") is not None else ""
            spread += f",probe_columns={row['probe_columns']}" if row.get("probe_columns") else ""
            variant = f"{row['selection']}[target={row['target']},tiles={row['tiles']},heads={row['heads']}{spread}]"
            for metric in ("density", "mass_mean", "mass_worst_row", "mass_worst_head", "cos_worst", "cos_mean"):
                results.add(row["shape"], variant, metric, row[metric])
        results.append(args.append_results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
