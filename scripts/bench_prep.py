#!/usr/bin/env python3
"""Device time of each preparation kernel (K/V stats, finalize, K/V quantization, Q quantization)
for several warp counts of the quantization kernels, K/V tiles per program and K/V-stats program
shapes, on the benchmark shapes (speed knobs: warps and tiles per program change nothing in the
results; the stats shape changes the fp32 summation order of mean(K), so its last bits). Direct
launches, as the registered op runs them in eager mode.

    python3 scripts/bench_prep.py --shapes cogvideox-2b,d128-8k --warps auto,4,8 --tiles 1,2,4,8 --json prep.json
    python3 scripts/bench_prep.py --warps auto --stats 256:64:4,1024:64:4,512:128:8   # tokens/split:chunk:warps
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import sys

import torch


def main(argv: list[str] | None = None) -> int:
    from bench_attention import SHAPES, bench_ms, prep_kernel_times  # this script's folder is on sys.path
    from torch._library.triton import set_wrap_triton_enabled

    from sagevideo.kernels import quantize
    from sagevideo.kernels.plans import select_plan
    from sagevideo.kernels.rotation import hadamard_pm1

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default="cogvideox-2b,d128-8k")
    parser.add_argument("--warps", default="auto,4,8", help="comma list of warp counts; auto = the per-tile rule")
    parser.add_argument("--tiles", default="1", help="K/V tiles per quantization program")
    parser.add_argument("--qtiles", default="auto", help="comma list of Q tiles per program; auto = the rule")
    parser.add_argument("--stats", default="auto",
                        help="comma list of K/V-stats program shapes MIN_TOKENS_PER_SPLIT:CHUNK:WARPS, "
                             "or auto (the rule)")
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    rows = []
    for name in args.shapes.split(","):
        b, h, n, d = SHAPES[name]
        q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.float16) for _ in range(3))
        for pv in ("fp16", "fp8"):
            plan = select_plan(q.device, d, pv).plan
            rot = hadamard_pm1(plan.block_d, q.device, q.dtype)
            warp_counts = [None if w == "auto" else int(w) for w in args.warps.split(",")]
            stats_shapes = args.stats.split(",")
            tile_counts = [int(t) for t in args.tiles.split(",")]
            q_tile_counts = [None if t == "auto" else int(t) for t in args.qtiles.split(",")]
            grid = itertools.product(warp_counts, tile_counts, stats_shapes, q_tile_counts)
            for warps, tiles, stats, q_tiles in grid:
                quantize.QUANT_WARPS = warps
                quantize.STATS_SHAPE = None if stats == "auto" else tuple(map(int, stats.split(":")))
                prepare = functools.partial(quantize.quantize_inputs, q, k, v, None, rot, plan, sm_scale=d**-0.5,
                                            per_token=False, smooth_k=True, need_shift=False, tiles_per_program=tiles,
                                            q_tiles=q_tiles)
                with set_wrap_triton_enabled(False):
                    times = prep_kernel_times(prepare)
                    wall = bench_ms(prepare)  # whole preparation between events: gaps and small launches too
                times = {key: ms for key, ms in times.items() if key.startswith("_")}
                rows.append({"shape": name, "pv": pv, "warps": warps, "tiles_per_program": tiles, "stats": stats,
                             "q_tiles": q_tiles,
                             "ms": times, "total_ms": sum(times.values()), "wall_ms": wall})
                print(f"{name:14} {pv:5} warps {warps} tiles {tiles} q-tiles {q_tiles} stats {stats}: "
                      f"wall {wall:.3f} ms, "
                      f"kernels {sum(times.values()):.3f} ms  "
                      + "  ".join(f"{key.strip('_').split('_kernel')[0]} {ms:.3f}" for key, ms in times.items()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
