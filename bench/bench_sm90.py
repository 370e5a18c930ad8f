#!/usr/bin/env python3
"""The sm90 Gluon attention kernel against the plain-Triton kernel and SDPA cuDNN.

Per shape, on the same quantized inputs (FP8 PV plan): the plain-Triton kernel and the Gluon kernel
at each number of K/V ring stages, kernel-only times (the median of `--reps` do_bench medians, all
kernels and cuDNN timed round-robin) and their ratio to SDPA cuDNN on the fp16 inputs; accuracy as
the worst cosine (over heads) against fp32 SDPA and the max |diff| against the plain-Triton
kernel's output. `--check` runs only small shapes (odd lengths, padded head dims) for correctness,
quickly.

    python -m bench.bench_sm90 --check
    python -m bench.bench_sm90 --json sm90.json [--shapes cogvideox-2b,d128-8k] [--stages 2,3] [--reps 5]
    python -m bench.bench_sm90 --shapes wan-720p --stages 2 --density 0.15 --density 0.5   # block-sparse too

`--density D`: both kernels also on block-sparse lists of that density (`experiments.bench.attention.
random_tile_mask`, one mask for every head, in the plan's tiles), timed in the same round-robin
("triton-dD", "sD-dD"); max |diff| of the Gluon lists' output against the plain kernel's on the same lists.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

if not __package__:  # run as a file (python bench/bench_sm90.py): `bench` from the repo root, as with -m
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.bench_attention import (  # noqa: E402
    SHAPES,
    bench_inputs,
    bench_interleaved,
    cosine_worst,
    reference_fp32,
    tops,
    versions,
)
from sagevideo.experiments.bench.attention import sdpa_call  # noqa: E402

CHECK_SHAPES = {"small-d64": (1, 2, 1000, 64), "small-d128": (2, 3, 777, 128), "small-d80": (1, 2, 300, 80),
                "one-tile": (1, 1, 100, 64), "two-tiles": (1, 2, 256, 128)}
STAGES = "2,3"


def parse_stages(spec: str) -> dict[str, int]:
    """"2,3" -> {"s2": 2, "s3": 3}: the Gluon variants timed, by K/V ring stages (at least 1)."""
    out = {}
    for item in spec.split(","):
        if not item.strip().isdigit() or int(item) < 1:
            raise SystemExit(f"bad ring stages {item!r}: a comma list of positive integers, e.g. 2,3")
        out[f"s{int(item)}"] = int(item)
    return out


def run_shape(name: str, shape, timed: bool, variants: dict[str, int], reps: int = 1,
              densities: tuple[float, ...] = ()) -> dict:
    from torch._library.triton import set_wrap_triton_enabled

    from sagevideo.kernels.attention_fwd import attention_forward
    from sagevideo.kernels.attention_sm90 import attention_forward_sm90
    from sagevideo.kernels.plans import plain_triton, select_plan
    from sagevideo.kernels.quantize import quantize_inputs
    from sagevideo.kernels.rotation import hadamard_pm1

    b, h, n, d = shape
    q, k, v = bench_inputs(shape)
    # The plain kernel's own plan (select_plan names the Gluon one at d128, whose stages are the
    # ring's, not the plain kernel's).
    plan = plain_triton(select_plan(q.device, d, "fp8").plan)
    rot = hadamard_pm1(plan.block_d, q.device, q.dtype)
    row: dict = {"shape": name, "B": b, "H": h, "N": n, "D": d, "plan": plan.describe(), "ms": {}, "cos_worst": {},
                 "max_diff_vs_triton": {}, "errors": {}}
    ref = reference_fp32(q, k, v)
    with set_wrap_triton_enabled(False):
        prepared = quantize_inputs(q, k, v, None, rot, plan, sm_scale=d**-0.5, per_token=False, smooth_k=True,
                                   need_shift=False)
        base = torch.empty_like(q)

        def triton_kernel():
            attention_forward(prepared, v, None, base, None, plan, is_causal=False, per_token=False, n_q=n, n_k=n)

        triton_kernel()
        row["cos_worst"]["triton"] = cosine_worst(ref, base)
        fns = {"sdpa-cudnn": sdpa_call("cudnn", q, k, v), "triton-kernel": triton_kernel}
        for label, stages in variants.items():
            out = torch.full_like(q, float("nan"))
            try:
                def gluon_kernel(out=out, stages=stages):
                    attention_forward_sm90(prepared, out, block_n=plan.block_n, n_q=n, n_k=n, num_stages=stages)

                gluon_kernel()
                torch.cuda.synchronize()
                row["cos_worst"][label] = cosine_worst(ref, out)
                row["max_diff_vs_triton"][label] = (out.float() - base.float()).abs().max().item()
                fns[label] = gluon_kernel
            except Exception as exc:  # record and go on: one variant's failure is a fact, not the end
                row["errors"][label] = f"{type(exc).__name__}: " + " | ".join(str(exc).splitlines()[:4])[:400]
        for density in densities:
            add_sparse_arms(fns, row, prepared, plan, v, density, variants)
        if timed:  # round-robin: the H200 drifts by several percent within a run
            row["ms"], row["ms_reps"], errors = bench_interleaved(fns, reps)
            row["errors"].update(errors)
    cudnn = row["ms"].get("sdpa-cudnn")
    row["tops"] = {key: tops(shape, ms) for key, ms in row["ms"].items()}
    row["vs_cudnn"] = {key: cudnn / ms for key, ms in row["ms"].items()} if cudnn else {}
    return row


def add_sparse_arms(fns: dict, row: dict, prepared, plan, v, density: float, variants: dict[str, int]) -> None:
    """Both kernels on one random tile mask of `density` (the prepared inputs' plan tiles) into `fns`;
    the Gluon arms' max |diff| against the plain kernel's sparse output into `row`."""
    from bench.bench_attention import square
    from sagevideo.experiments.bench.attention import random_tile_mask
    from sagevideo.kernels.attention_fwd import attention_forward
    from sagevideo.kernels.attention_sm90 import attention_forward_sm90

    n = v.shape[2]
    mask = random_tile_mask(square(tuple(v.shape)), density, "cuda").at_tiles(plan.block_m, plan.block_n)
    lists = mask.padded_lists()
    row.setdefault("density", {})[f"d{density:g}"] = mask.density
    base = torch.empty_like(v)

    def triton_sparse():
        attention_forward(prepared, v, None, base, None, plan, is_causal=False, per_token=False, n_q=n, n_k=n,
                          tile_lists=lists)

    triton_sparse()
    fns[f"triton-d{density:g}"] = triton_sparse
    for label, stages in variants.items():
        out = torch.full_like(base, float("nan"))

        def gluon_sparse(out=out, stages=stages):
            attention_forward_sm90(prepared, out, block_n=plan.block_n, n_q=n, n_k=n, num_stages=stages,
                                   tile_lists=lists)

        gluon_sparse()
        torch.cuda.synchronize()
        row["max_diff_vs_triton"][f"{label}-d{density:g}"] = (out.float() - base.float()).abs().max().item()
        fns[f"{label}-d{density:g}"] = gluon_sparse


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="small correctness shapes only, untimed")
    parser.add_argument("--shapes", default="cogvideox-2b,cogvideox-5b,d128-8k,d128-32k,d128-75k")
    parser.add_argument("--stages", default=STAGES, help="comma list of the Gluon kernel's K/V ring stages")
    parser.add_argument("--untimed", action="store_true", help="one launch per kernel (for a profiler), no timing")
    parser.add_argument("--reps", type=int, default=3, help="round-robin repetitions (median reported)")
    parser.add_argument("--density", type=float, action="append", default=[],
                        help="also both kernels on random tile lists of this density (repeatable)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    variants = parse_stages(args.stages)
    shapes = CHECK_SHAPES if args.check else {name: SHAPES[name] for name in args.shapes.split(",")}
    rows = []
    for name, shape in shapes.items():
        rows.append(run_shape(name, shape, not (args.check or args.untimed), variants, args.reps,
                              tuple(args.density)))
        r = rows[-1]
        print(f"{name:14s} cos " + " ".join(f"{k}={v:.5f}" for k, v in r["cos_worst"].items())
              + " | maxdiff " + " ".join(f"{k}={v:.2e}" for k, v in r["max_diff_vs_triton"].items())
              + (" | x cuDNN " + " ".join(f"{k}={v:.2f}" for k, v in r["vs_cudnn"].items()) if r["vs_cudnn"] else "")
              + (f" | ERRORS {r['errors']}" if r["errors"] else ""), flush=True)
    if args.json:
        args.json.write_text(json.dumps({"versions": versions(), "rows": rows}, indent=1))
    # `not >=` so that a NaN cosine (a kernel writing NaN) fails too: NaN < 0.998 is False
    bad = [r["shape"] for r in rows if r["errors"] or not all(c >= 0.998 for c in r["cos_worst"].values())]
    verdict = "FAILED: " + ", ".join(bad) if bad else "all variants ran, cosine >= 0.998"
    print(f"bench_sm90: {len(rows)} shapes, {verdict}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
