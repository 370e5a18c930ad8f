#!/usr/bin/env python3
"""Kernel-only A/B of plan variants on the same quantized inputs, timed round-robin (FP8 PV).

Each variant is the shape's plain-Triton plan with some fields overridden (speed knobs only:
`num_warps`, `num_stages`, `max_registers`, `scores_by_add`; tiles would change the quantized
inputs). Every variant and SDPA cuDNN are timed `--reps` times in round-robin order and the median
is reported, with each variant's worst cosine against fp32 SDPA. `--base` overrides the plan
itself first, so that a comparison stays reproducible after the plan has changed.

    python -m bench.bench_plan_variants --shapes cogvideox-2b,cogvideox-5b \\
        --base max_registers=none,num_stages=3 \\
        --variants "r128:max_registers=128;r128s2:max_registers=128,num_stages=2" --reps 5
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import torch

if not __package__:  # run as a file (python bench/bench_plan_variants.py): `bench` from the repo root, as with -m
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.bench_attention import (  # noqa: E402
    SHAPES,
    bench_inputs,
    bench_interleaved,
    cosine_worst,
    direct,
    reference_fp32,
    tops,
)
from sagevideo.experiments.bench.attention import sdpa_call  # noqa: E402

KNOBS = {"num_warps": int, "num_stages": int, "max_registers": int, "scores_by_add": bool}


def parse_overrides(spec: str) -> dict:
    """"max_registers=128,num_stages=2" -> {"max_registers": 128, "num_stages": 2}; "none" -> None."""
    out: dict = {}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        field, _, value = item.partition("=")
        if field not in KNOBS or not value:
            raise ValueError(f"{item!r}: expected FIELD=VALUE with FIELD one of {sorted(KNOBS)}")
        if value.lower() == "none":
            out[field] = None
        elif KNOBS[field] is bool:
            if value.lower() not in ("true", "false", "on", "off", "1", "0"):
                raise ValueError(f"{item!r}: {field} takes true/false")
            out[field] = value.lower() in ("true", "on", "1")
        else:
            out[field] = int(value)
    return out


def parse_variants(spec: str) -> dict:
    """"r128:max_registers=128;s2:num_stages=2" -> {"r128": {...}, "s2": {...}}."""
    variants = {}
    for item in filter(None, (s.strip() for s in spec.split(";"))):
        name, _, overrides = item.partition(":")
        if not name or name in ("base", "cudnn"):
            raise ValueError(f"{item!r}: expected NAME:FIELD=VALUE,... with a name other than base/cudnn")
        variants[name] = parse_overrides(overrides)
    return variants


def run_shape(name: str, base_overrides: dict, variants: dict, reps: int) -> dict:
    from torch._library.triton import set_wrap_triton_enabled

    from sagevideo.kernels.attention_fwd import attention_forward
    from sagevideo.kernels.plans import plain_triton, select_plan
    from sagevideo.kernels.quantize import quantize_inputs
    from sagevideo.kernels.rotation import hadamard_pm1

    shape = SHAPES[name]
    b, h, n, d = shape
    q, k, v = bench_inputs(shape)
    base = dataclasses.replace(plain_triton(select_plan(q.device, d, "fp8").plan), **base_overrides)
    plans = {"base": base, **{label: dataclasses.replace(base, **o) for label, o in variants.items()}}
    rotation = hadamard_pm1(base.block_d, q.device, q.dtype)
    ref = reference_fp32(q, k, v)
    # One preparation for every variant: the same codes (tiles are not a knob here), with the K scale
    # maxima tracked when any variant converts scores by an integer add (its guard reads them).
    tracking = dataclasses.replace(base, scores_by_add=any(p.scores_by_add for p in plans.values()))
    with set_wrap_triton_enabled(False):
        prepared = quantize_inputs(q, k, v, None, rotation, tracking, sm_scale=d**-0.5, per_token=False,
                                   smooth_k=True, need_shift=False)
    fns, cos = {}, {}
    for label, plan in plans.items():
        out = torch.empty_like(q)

        run = direct(lambda plan=plan, out=out: attention_forward(
            prepared, v, None, out, None, plan, is_causal=False, per_token=False, n_q=n, n_k=n))
        run()
        torch.cuda.synchronize()
        cos[label] = cosine_worst(ref, out)
        fns[label] = run
    fns["cudnn"] = sdpa_call("cudnn", q, k, v)
    ms, runs, errors = bench_interleaved(fns, reps)
    return {"shape": name, "plans": {label: p.describe() for label, p in plans.items()}, "ms": ms, "ms_reps": runs,
            "errors": errors, "cos_worst": cos, "tops": {key: tops(shape, t) for key, t in ms.items()},
            "vs_cudnn": {key: ms["cudnn"] / t for key, t in ms.items()} if "cudnn" in ms else {}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default="cogvideox-2b,cogvideox-5b", help=f"comma list of {sorted(SHAPES)}")
    parser.add_argument("--base", default="", help="overrides of the plan itself, e.g. max_registers=none")
    parser.add_argument("--variants", required=True, help="NAME:FIELD=VALUE,...;NAME:...")
    parser.add_argument("--reps", type=int, default=5, help="round-robin repetitions (median reported)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    try:
        base, variants = parse_overrides(args.base), parse_variants(args.variants)
    except ValueError as exc:
        parser.error(str(exc))
    unknown = [s for s in args.shapes.split(",") if s not in SHAPES]
    if unknown or args.reps < 1:
        parser.error(f"unknown shapes {unknown}" if unknown else "--reps must be at least 1")
    if not torch.cuda.is_available():
        print("bench_plan_variants: needs a CUDA GPU", file=sys.stderr)
        return 2
    rows = []
    for name in args.shapes.split(","):
        row = run_shape(name, base, variants, args.reps)
        rows.append(row)
        print(f"{name:14s} " + " ".join(f"{key} {row['tops'][key]:.0f} TOPS ({row['vs_cudnn'].get(key, 0):.3f}x)"
                                        for key in row["ms"]) + (f" ERRORS {row['errors']}" if row["errors"] else ""),
              flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    worst = min(c for r in rows for c in r["cos_worst"].values())
    print(f"bench_plan_variants: {len(rows)} shapes x {len(variants) + 1} plans, {args.reps} round-robin runs each, "
          f"worst cosine {worst:.5f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
