#!/usr/bin/env python3
"""The sm90 Gluon attention kernel against the plain-Triton kernel and SDPA cuDNN (issue 4).

Per shape, on the same quantized inputs (FP8 PV plan): the plain-Triton kernel and each Gluon
variant (schedule serial/pipelined x ring stages), kernel-only times (the median of `--reps`
do_bench medians, all variants and cuDNN timed round-robin) and their ratio to SDPA cuDNN on the
fp16 inputs; accuracy as the worst cosine (over heads) against fp32
SDPA and the max |diff| against the plain-Triton kernel's output. `--check` runs only small
shapes (odd lengths, padded head dims) for correctness, quickly.

    python3 scripts/bench_sm90.py --check
    python3 scripts/bench_sm90.py --json sm90.json [--shapes cogvideox-2b,d128-8k] [--variants s2c1,p3c1] [--reps 5]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_attention import (  # noqa: E402
    SHAPES,
    bench_inputs,
    bench_interleaved,
    cosine_worst,
    reference_fp32,
    sdpa_fn,
    tops,
    versions,
)

CHECK_SHAPES = {"small-d64": (1, 2, 1000, 64), "small-d128": (2, 3, 777, 128), "small-d80": (1, 2, 300, 80),
                "one-tile": (1, 1, 100, 64), "two-tiles": (1, 2, 256, 128)}
# s = serial, p = pipelined (intra-warpgroup overlap); the digit = ring stages; then, in this order,
# optionally: "d1"/"d2" = timing experiments that drop one stage (d1: softmax, d2: the P·V MMA),
# whose outputs are wrong; "r2" = ring stages released in pairs (serial, even stages); "c1" = one
# consumer warpgroup per CTA (two CTAs per SM) instead of two; "a" = scores converted by an integer
# add (`scores_by_add`), "i" = by I2F; neither: as the Gluon plan has it.
VARIANTS = "s2,p2,p3,p4"
VARIANT_PATTERN = r"([sp])(\d+)(?:d([12]))?(?:r([12]))?(?:c([12]))?([ai])?"


def parse_variants(spec: str) -> dict:
    """"s2,p4d1,s4r2c1a" -> {name: attention_forward_sm90 keyword arguments}, e.g. "s2d1c1" ->
    {"pipeline_qk": False, "num_stages": 2, "drop": 1, "release": 1, "consumers": 1,
    "scores_by_add": None} (None: as the Gluon plan has it)."""
    out = {}
    for name in spec.split(","):
        match = re.fullmatch(VARIANT_PATTERN, name)
        if not match:
            raise SystemExit(f"bad variant {name!r}: s<stages> or p<stages>, then optionally d1/d2, r2, c1/c2, "
                             "a/i in that order, e.g. p3, s2d1, s2c1a or s2d1c1a")
        out[name] = {"pipeline_qk": match[1] == "p", "num_stages": int(match[2]), "drop": int(match[3] or 0),
                     "release": int(match[4] or 1), "consumers": int(match[5] or 2),
                     "scores_by_add": None if match[6] is None else match[6] == "a"}
    return out


def run_shape(name: str, shape, timed: bool, variants: dict, reps: int = 1) -> dict:
    from torch._library.triton import set_wrap_triton_enabled

    from sagevideo.kernels.attention_fwd import attention_forward
    from sagevideo.kernels.attention_sm90 import attention_forward_sm90
    from sagevideo.kernels.plans import plain_triton, scores_by_add, select_plan
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
        fns = {"sdpa-cudnn": sdpa_fn("cudnn", q, k, v), "triton-kernel": triton_kernel}
        for label, kwargs in variants.items():
            out = torch.full_like(q, float("nan"))
            if kwargs["scores_by_add"] is None:
                kwargs = {**kwargs, "scores_by_add": scores_by_add(plan.arch, plan.block_d, plan.pv, "gluon")}
            try:
                def gluon_kernel(out=out, kwargs=kwargs):
                    attention_forward_sm90(prepared, out, block_n=plan.block_n, n_q=n, n_k=n, **kwargs)

                gluon_kernel()
                torch.cuda.synchronize()
                if not kwargs["drop"]:  # drop variants compute something else on purpose
                    row["cos_worst"][label] = cosine_worst(ref, out)
                    row["max_diff_vs_triton"][label] = (out.float() - base.float()).abs().max().item()
                fns[label] = gluon_kernel
            except Exception as exc:  # record and go on: one variant's failure is a fact, not the end
                row["errors"][label] = f"{type(exc).__name__}: " + " | ".join(str(exc).splitlines()[:4])[:400]
        if timed:  # round-robin: the H200 drifts by several percent within a run
            row["ms"], row["ms_reps"], errors = bench_interleaved(fns, reps)
            row["errors"].update(errors)
    cudnn = row["ms"].get("sdpa-cudnn")
    row["tops"] = {key: tops(shape, ms) for key, ms in row["ms"].items()}
    row["vs_cudnn"] = {key: cudnn / ms for key, ms in row["ms"].items()} if cudnn else {}
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="small correctness shapes only, untimed")
    parser.add_argument("--shapes", default="cogvideox-2b,cogvideox-5b,d128-8k,d128-32k,d128-75k")
    parser.add_argument("--variants", default=VARIANTS)
    parser.add_argument("--untimed", action="store_true", help="one launch per kernel (for a profiler), no timing")
    parser.add_argument("--reps", type=int, default=3, help="round-robin repetitions (median reported)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    variants = parse_variants(args.variants)
    shapes = CHECK_SHAPES if args.check else {name: SHAPES[name] for name in args.shapes.split(",")}
    rows = []
    for name, shape in shapes.items():
        rows.append(run_shape(name, shape, not (args.check or args.untimed), variants, args.reps))
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
