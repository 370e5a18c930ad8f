#!/usr/bin/env python3
"""Accuracy of every PV mode on the adversarial presets vs fp64 attention (CPU is fine).

Runs the reference (the kernels' exact numerics) with default settings on fp16 inputs and prints
a markdown table: worst / mean cosine over (batch, head) and worst rel-L1, per preset and mode.
`--score-std` instead sweeps how peaky attention is (q, k ~ N(0, std): scores q·k/sqrt(D) of that
standard deviation) and prints the worst cosine of every mode: where INT8 stops being enough.

    python -m bench.accuracy_table [--shape 2,4,1024,128] [--seed 1] [--granularity block]
    python -m bench.accuracy_table --score-std 1,10,30,100,300,1000 --shape 1,4,1024,64
"""

from __future__ import annotations

import argparse

import torch

from sagevideo.eval.numerics.presets import CONTRACT_PRESETS, score_std_scaled
from sagevideo.eval.numerics.simulate import Variant, evaluate_layer, simulate


def score_std_table(stds: list[float], shape: tuple[int, ...], seed: int) -> None:
    """Worst cosine vs fp64 per mode as attention gets peakier (fp16 inputs, like the models')."""
    modes = [Variant(pv=pv, granularity=g, head_dim=shape[-1]) for g in ("block", "token") for pv in ("fp16", "fp8")]
    print(f"shape {shape}, seed {seed}, fp16 inputs, smoothing + rotation on; worst cosine over heads vs fp64\n")
    print("| score std | " + " | ".join(f"int8 {m.granularity} + {m.pv.upper()} PV" for m in modes) + " |")
    print("|---|" + "---|" * len(modes))
    for std in stds:
        x = score_std_scaled(shape, torch.Generator().manual_seed(seed), std)
        q, k, v = (t.half().float() for t in (x.q, x.k, x.v))
        cells = [f"{evaluate_layer('l', q, k, v, m).stats.cos_worst:.5f}" for m in modes]
        print(f"| {std:g} | " + " | ".join(cells) + " |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="2,4,1024,128")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--granularity", default="block", choices=["block", "token"])
    parser.add_argument("--score-std", help="comma list of score standard deviations to sweep instead")
    args = parser.parse_args()
    shape = tuple(int(x) for x in args.shape.split(","))
    if args.score_std:
        score_std_table([float(x) for x in args.score_std.split(",")], shape, args.seed)
        return 0
    variants = [Variant(pv=pv, granularity=args.granularity) for pv in ("fp16", "fp8")]
    print(f"shape {shape}, seed {args.seed}, fp16 inputs, granularity {args.granularity}, smoothing + rotation on\n")
    print("| preset | FP16 PV cos worst / mean | rel-L1 worst | FP8 PV cos worst / mean | rel-L1 worst |")
    print("|---|---|---|---|---|")
    for preset in CONTRACT_PRESETS:
        cells = []
        for result in simulate(variants, preset=preset, shape=shape, seed=args.seed, dtype="fp16"):
            s = result.summary()
            cells += [f"{s['cos_worst']:.5f} / {s['cos_mean']:.5f}", f"{s['rel_l1_worst']:.4f}"]
        print(f"| {preset} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
