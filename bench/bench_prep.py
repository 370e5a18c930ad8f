#!/usr/bin/env python3
"""Device time of each preparation kernel (K/V stats, finalize, K/V quantization, Q quantization)
under variants of the plan's `PrepPlan`: warp counts of the quantization kernels, K/V and Q tiles
per program and K/V-stats program shapes, on the benchmark shapes. Speed knobs: warps and tiles per
program change nothing in the results; the stats shape changes the fp32 summation order of mean(K),
so its last bits. Direct launches, as the registered op runs them in eager mode.

    python -m bench.bench_prep --shapes cogvideox-2b,d128-8k --warps auto,4,8 --tiles 1,2,4,8 --json prep.json
    python -m bench.bench_prep --warps auto --stats 256:64:4,1024:64:4,512:128:8   # tokens/split:chunk:warps
    python -m bench.bench_prep --shapes wan-720p,cogvideox-5b --warps auto,4,8 --pool off,on

--pool on: also the tile selection's pooled statistics, as a dynamic sparse call asks for them;
off: the dense call's preparation.

"auto" keeps the plan's value. Tiles per program stay capped so that each head gets at least the
plan's `min_programs_per_head` programs (which binds only on short sequences).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import itertools
import json
import sys
from pathlib import Path

import torch

if not __package__:  # run as a file (python bench/bench_prep.py): `bench` from the repo root, as with -m
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def prep_variant(base, warps: int | None, kv_tiles: int | None, stats: str, q_tiles: int | None):
    """`base` (a PrepPlan) with the given fields replaced; None / "auto" keep the plan's."""
    changes: dict = {}
    if warps is not None:
        changes.update(kv_warps=warps, q_warps=warps)
    if kv_tiles is not None:
        changes["kv_tiles_per_program"] = kv_tiles
    if q_tiles is not None:
        changes["q_tiles_per_program"] = q_tiles
    if stats != "auto":
        changes.update(zip(("stats_min_tokens", "stats_chunk", "stats_warps"), map(int, stats.split(":")), strict=True))
    return dataclasses.replace(base, **changes)


def main(argv: list[str] | None = None) -> int:
    from torch._library.triton import set_wrap_triton_enabled

    from bench.bench_attention import SHAPES, bench_ms, prep_kernel_times
    from sagevideo.kernels import quantize
    from sagevideo.kernels.plans import prep_plan, select_plan
    from sagevideo.kernels.rotation import hadamard_pm1

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default="cogvideox-2b,d128-8k")
    parser.add_argument("--warps", default="auto,4,8", help="comma list of quantization warp counts; auto = the plan's")
    parser.add_argument("--tiles", default="auto", help="comma list of K/V tiles per program; auto = the plan's")
    parser.add_argument("--qtiles", default="auto", help="comma list of Q tiles per program; auto = the plan's")
    parser.add_argument("--stats", default="auto",
                        help="comma list of K/V-stats program shapes MIN_TOKENS_PER_SPLIT:CHUNK:WARPS, "
                             "or auto (the plan's)")
    parser.add_argument("--pool", default="off", help="comma list of off, on (module docstring)")
    parser.add_argument("--no-rotate", action="store_true", help="no Hadamard rotation (installed calls rotate)")
    parser.add_argument("--json")
    args = parser.parse_args(argv)

    def counts(spec: str) -> list[int | None]:
        return [None if item == "auto" else int(item) for item in spec.split(",")]

    rows = []
    for name in args.shapes.split(","):
        b, h, n, d = SHAPES[name]
        q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.float16) for _ in range(3))
        for pv in ("fp16", "fp8"):
            plan = select_plan(q.device, d, pv).plan
            rot = None if args.no_rotate else hadamard_pm1(plan.block_d, q.device, q.dtype)
            grid = itertools.product(counts(args.warps), counts(args.tiles), args.stats.split(","), counts(args.qtiles),
                                     args.pool.split(","))
            for warps, tiles, stats, q_tiles, pool in grid:
                prep = prep_variant(prep_plan(plan), warps, tiles, stats, q_tiles)
                prepare = functools.partial(quantize.quantize_inputs, q, k, v, None, rot, plan, sm_scale=d**-0.5,
                                            per_token=False, smooth_k=True, need_shift=False, prep=prep,
                                            pool=pool == "on")
                with set_wrap_triton_enabled(False):
                    times = prep_kernel_times(prepare)
                    wall = bench_ms(prepare)  # whole preparation between events: gaps and small launches too
                times = {key: ms for key, ms in times.items() if key.startswith("_")}
                rows.append({"shape": name, "pv": pv, "warps": warps, "tiles_per_program": tiles, "stats": stats,
                             "q_tiles": q_tiles, "pool": pool, "rotate": rot is not None,
                             "prep": dataclasses.asdict(prep),
                             "ms": times, "total_ms": sum(times.values()), "wall_ms": wall})
                print(f"{name:14} {pv:5} warps {warps} tiles {tiles} q-tiles {q_tiles} stats {stats} pool {pool}: "
                      f"wall {wall:.3f} ms, "
                      f"kernels {sum(times.values()):.3f} ms  "
                      + "  ".join(f"{key.strip('_').split('_kernel')[0]} {ms:.3f}" for key, ms in times.items()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
