#!/usr/bin/env python3
"""Compile the sm90 Gluon attention kernel for Hopper without a GPU (layout/type errors, PTX facts).

Builds the kernel's Gluon source with the argument types a real launch would have and compiles it
for sm_90 (`triton.compile` with an explicit target: no driver needed), for each head dim, output
dtype and number of K/V ring stages. Prints, per configuration, the shared memory per CTA and counts
of wgmma/TMA instructions in the PTX.

    python3 tools/gluon_compile_check.py                 # d64 and d128, bf16 and fp16, the plan's stages
    python3 tools/gluon_compile_check.py --stages 2,3 --ptx out.ptx   # also write the last PTX
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from sagevideo.kernels import attention_sm90 as sm90  # noqa: E402
from sagevideo.kernels.plans import gluon_stages  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ptx", type=Path)
    parser.add_argument("--dims", default="64,128")
    parser.add_argument("--dtypes", default="bf16,fp16", help="output (= input) dtypes")
    parser.add_argument("--stages", help="comma list of K/V ring stages (default: the plan's per head dim)")
    args = parser.parse_args()
    failed = 0
    kernel = None
    for head_d in map(int, args.dims.split(",")):
        stage_counts = [int(s) for s in args.stages.split(",")] if args.stages else [gluon_stages(head_d)]
        for out_dtype in args.dtypes.split(","):
            for stages in stage_counts:
                name = f"d{head_d} {out_dtype} {stages} stages"
                try:
                    kernel = sm90.compile_for_sm90(head_d, num_stages=stages, out_dtype=out_dtype)
                except Exception as exc:  # report and go on: each configuration is a separate fact
                    failed += 1
                    print(f"{name}: FAILED {type(exc).__name__}: {str(exc)[:3000]}")
                    continue
                ptx = kernel.asm["ptx"]
                counts = {k: len(re.findall(p, ptx)) for k, p in {
                    "wgmma": r"wgmma\.mma_async", "tma": r"cp\.async\.bulk\.tensor", "setmaxnreg": r"setmaxnreg",
                    "st.shared": r"st\.shared", "ld.shared": r"ld\.shared",
                    "bar.sync": r"bar\.sync|barrier\.sync"}.items()}
                print(f"{name}: ok, shared {kernel.metadata.shared} B, {counts}")
    if args.ptx and kernel is not None:
        args.ptx.write_text(kernel.asm["ptx"])
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
