#!/usr/bin/env python3
"""Accuracy of every PV mode on the adversarial presets vs fp64 attention (CPU is fine).

Runs the reference (the kernels' exact numerics) with default settings on fp16 inputs and prints
a markdown table: worst / mean cosine over (batch, head) and worst rel-L1, per preset and mode.

    python scripts/accuracy_table.py [--shape 2,4,1024,128] [--seed 1] [--granularity block]
"""

from __future__ import annotations

import argparse

from sagevideo.eval.presets import CONTRACT_PRESETS
from sagevideo.eval.simulate import Variant, simulate


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="2,4,1024,128")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--granularity", default="block", choices=["block", "token"])
    args = parser.parse_args()
    shape = tuple(int(x) for x in args.shape.split(","))
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
