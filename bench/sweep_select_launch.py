#!/usr/bin/env python3
"""Launch constants of the device tile selection, timed side by side: which to put in
`sagevideo/kernels/tile_select_kernel.py` (maintainer sweep; it writes no results rows).

On planted-structure inputs at a real shape (`eval/numerics/planted.py`), the preparation with
pooling and the probe run once; then `select_lists` (the scores GEMM and the selection kernel, the two
launches the selection adds after the preparation) runs with each variant of the module's launch
constants, interleaved over rounds (median, CUDA events). Each variant's lists are compared with
those of the constants in the module: the selection kernel's variants (rows per program, warps, the
per-row density's threshold search) must keep every list identical; a scores precision other than
"ieee" may move ties near the cut, so the rows whose list differs are counted.

    python -m bench.sweep_select_launch --shape wan-720p --heads 40 [--density 0.15] [--top-p 0.9]

The selection is the installed one: the per-row density with the probe's columns
(`attention.sparse.dynamic_selection`), or one top_p for every query tile with --top-p.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path

if not __package__:  # run as a file: `bench` from the repo root, as with -m
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.bench_sparse_select import SHAPES, cell_for  # noqa: E402

# name -> the module constants it sets (those it leaves keep the module's values). A selection program
# holds min(MAX_ROWS, SELECT_ELEMENTS // T_PAD) query tiles on a GPU (T_PAD: the key tiles to a power of
# two, 1,024 at Wan 720p: at most 4 rows with 4,096 elements; the interpreter takes INTERPRETER_MAX_ROWS)
VARIANTS = {
    "module": {},
    # the earlier constants (fp32 scores, up to 16 rows a program on 8 warps), each change alone
    "ieee rows<=16 w8": {"SCORE_PRECISION": "ieee", "MAX_ROWS": 16, "SELECT_WARPS": 8},
    "ieee": {"SCORE_PRECISION": "ieee"},
    "rows<=16 w8": {"MAX_ROWS": 16, "SELECT_WARPS": 8},
    "rows<=1 w2": {"MAX_ROWS": 1, "SELECT_WARPS": 2},
    "rows<=1 w1": {"MAX_ROWS": 1, "SELECT_WARPS": 1},  # every reduction within one warp: no shared memory
    "rows<=2 w2": {"MAX_ROWS": 2, "SELECT_WARPS": 2},
    "rows<=2 w4": {"MAX_ROWS": 2, "SELECT_WARPS": 4},
    # more rows where the key tiles are few (CogVideoX-5B: 276 key tiles, 512 padded)
    "rows<=4 w4 1024": {"MAX_ROWS": 4, "SELECT_ELEMENTS": 1024},
    "scores 64x64x32": {"SCORE_M": 64, "SCORE_N": 64, "SCORE_D": 32},
    "scores 64x128x32 w8": {"SCORE_M": 64, "SCORE_N": 128, "SCORE_D": 32, "SCORE_WARPS": 8},
    "scores 32x128x32": {"SCORE_M": 32, "SCORE_N": 128, "SCORE_D": 32},
    "w8": {"SELECT_WARPS": 8},
}


@contextlib.contextmanager
def launch_constants(values: dict):
    """The selection module's launch constants set to `values` inside the block, restored after."""
    from sagevideo.kernels import tile_select_kernel

    before = {name: getattr(tile_select_kernel, name) for name in values}
    for name, value in values.items():
        setattr(tile_select_kernel, name, value)
    try:
        yield
    finally:
        for name, value in before.items():
            setattr(tile_select_kernel, name, value)


def run(shape_name: str, *, heads: int | None, density: float, top_p: float | None, pv: str, rounds: int,
        variants: list[str], device: str = "cuda") -> list[dict]:
    import torch

    from sagevideo.attention.sparse import dynamic_selection
    from sagevideo.eval.numerics.planted import PlantedSpec, planted_inputs
    from sagevideo.experiments.bench.timing import median, median_ms
    from sagevideo.kernels.plans import plain_triton, select_plan
    from sagevideo.kernels.tile_select import grid_tile_order
    from sagevideo.kernels.tile_select_kernel import select_lists, selection_inputs

    batch, all_heads, grid, head_dim, prefix, suffix = SHAPES[shape_name]
    heads = heads or all_heads
    plan = plain_triton(select_plan(torch.device(device), head_dim, pv).plan)
    spec = PlantedSpec(batch, heads, *grid, head_dim, text_prefix=prefix, text_suffix=suffix)
    inputs = planted_inputs(spec, order=grid_tile_order(*grid, *cell_for(max(plan.block_m, plan.block_n))),
                            device=device)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    q, k = (t.to(dtype) for t in (inputs.q, inputs.k))
    n_q, n_k = q.shape[2], k.shape[2]
    key_tiles = -(-n_k // plan.block_n)
    selection = dynamic_selection(density, key_tiles=key_tiles, top_p=top_p, text_first=prefix, text_last=suffix)
    pooled, probe = selection_inputs(q, k, plan, selection, sm_scale=inputs.sm_scale)

    def select():
        return select_lists(pooled, selection, batch=batch, heads=heads, kv_heads=k.shape[1], n_q=n_q, n_k=n_k,
                            block_m=plan.block_m, block_n=plan.block_n, sm_scale=inputs.sm_scale, probe=probe)

    reference_indices, reference_counts = select()
    times: dict[str, list[float]] = {name: [] for name in variants}
    differing: dict[str, int] = {}
    for name in variants:
        with launch_constants(VARIANTS[name]):
            indices, counts = select()
        same_row = (indices == reference_indices).all(dim=-1) & (counts == reference_counts)
        differing[name] = int((~same_row).sum())
    for _ in range(rounds):
        for name in variants:
            with launch_constants(VARIANTS[name]):
                times[name].append(median_ms(select, device, budget_ms=100))
    rows = []
    module_ms = median(times["module"]) if "module" in times else None
    for name in variants:
        ms = median(times[name])
        rows.append({"shape": shape_name, "q": list(q.shape), "pv": pv, "tiles": f"{plan.block_m}x{plan.block_n}",
                     "selection": f"top_p {top_p}" if top_p is not None else f"per-row {density}",
                     "probe_columns": selection.probe_columns, "variant": name, "constants": VARIANTS[name],
                     "ms": round(ms, 4), "x_module": round(module_ms / ms, 3) if module_ms else None,
                     "rows_differing": differing[name], "rows": int(reference_counts.numel()),
                     "density": round(float(reference_counts.float().mean()) / key_tiles, 4),
                     "device": torch.cuda.get_device_name() if device == "cuda" else device})
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="wan-720p")
    parser.add_argument("--heads", type=int, default=None, help="heads of the planted inputs (default: the shape's)")
    parser.add_argument("--density", type=float, default=0.15, help="the per-row density (default 0.15)")
    parser.add_argument("--top-p", type=float, default=None, help="one top_p for every query tile instead")
    parser.add_argument("--pv", choices=("fp16", "fp8"), default="fp8", help="P·V mode: its plan's tiles")
    parser.add_argument("--variant", action="append", choices=sorted(VARIANTS),
                        help="variants to time (repeatable; default all)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (the median is reported)")
    parser.add_argument("--device", default="cuda", help="cpu: a smoke run under TRITON_INTERPRET=1")
    parser.add_argument("--json", type=Path, default=None, help="write the rows as JSON here")
    args = parser.parse_args(argv)
    variants = args.variant or list(VARIANTS)
    if "module" not in variants:
        variants = ["module", *variants]
    rows = run(args.shape, heads=args.heads, density=args.density, top_p=args.top_p, pv=args.pv, rounds=args.rounds,
               variants=variants, device=args.device)
    print(f"{rows[0]['shape']} q {rows[0]['q']} pv={args.pv} tiles {rows[0]['tiles']}, {rows[0]['selection']}, "
          f"probe {rows[0]['probe_columns']} columns, density {rows[0]['density']:.3f}, {rows[0]['device']}")
    print(f"{'variant':<22} {'ms':>9} {'x module':>9} {'rows differing':>15}")
    for row in rows:
        print(f"{row['variant']:<22} {row['ms']:>9.3f} {row['x_module']:>9.2f} "
              f"{row['rows_differing']:>7} / {row['rows']}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
