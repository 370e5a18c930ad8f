#!/usr/bin/env python3
"""Compile the sm90 Gluon attention kernel for Hopper without a GPU (layout/type errors, PTX facts).

Builds the kernel's Gluon source with the argument types a real launch would have and compiles it
for sm_90 (`triton.compile` with an explicit target: no driver needed). Prints, per variant, the
shared memory per CTA, registers if known, and counts of wgmma/TMA instructions in the PTX.

    python3 scripts/gluon_compile_check.py                 # d64 and d128, both schedules
    python3 scripts/gluon_compile_check.py --ptx out.ptx   # also write the last PTX
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from sagevideo.kernels import attention_sm90 as sm90  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ptx", type=Path)
    parser.add_argument("--dims", default="64,128")
    parser.add_argument("--consumers", type=int, default=1, help="consumer warpgroups per CTA (1 or 2)")
    args = parser.parse_args()
    failed = 0
    kernel = None
    for head_d in map(int, args.dims.split(",")):
        for pipeline, drop in ((False, 0), (True, 0), (False, 1), (True, 1), (False, 2), (True, 2)):
            name = f"d{head_d} {'pipelined' if pipeline else 'serial'}{f' drop={drop}' if drop else ''}"
            try:
                kernel = sm90.compile_for_sm90(head_d, pipeline_qk=pipeline, drop=drop, consumers=args.consumers)
            except Exception as exc:  # report and go on: each variant is a separate fact
                failed += 1
                print(f"{name}: FAILED {type(exc).__name__}: {str(exc)[:3000]}")
                continue
            ptx = kernel.asm["ptx"]
            counts = {k: len(re.findall(p, ptx)) for k, p in {
                "wgmma": r"wgmma\.mma_async", "tma": r"cp\.async\.bulk\.tensor", "setmaxnreg": r"setmaxnreg",
                "st.shared": r"st\.shared", "ld.shared": r"ld\.shared", "bar.sync": r"bar\.sync|barrier\.sync"}.items()}
            print(f"{name}: ok, shared {kernel.metadata.shared} B, {counts}")
    if args.ptx and kernel is not None:
        args.ptx.write_text(kernel.asm["ptx"])
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
