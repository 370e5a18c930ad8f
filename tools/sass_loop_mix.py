"""Instruction mix of the attention kernels' main loops, from sm_90 SASS compiled on this machine.

Compiles the plain-Triton kernel (`attention_fwd`) and the Gluon kernel (`attention_sm90`) for
Hopper without a GPU, disassembles them with the cuobjdump that ships with Triton, finds each loop
(a backward branch) that issues tensor-core MMAs, and prints its instruction count and opcode mix.
The softmax is issue-bound (docs/sm90-kernel.md), so fewer instructions per key tile is the
prediction a change can be checked against before any GPU time is spent.

    python3 tools/sass_loop_mix.py                  # plain and Gluon kernels, d64 and d128 FP8 plans
    python3 tools/sass_loop_mix.py --kernels plain --pv fp16
    python3 tools/sass_loop_mix.py --kernels plain --sass /tmp/sass   # also write the SASS files
    python3 tools/sass_loop_mix.py --kernels plain --dims 64 --tile 64x128 --launch 4x3
    python3 tools/sass_loop_mix.py --kernels plain --sparse       # the block-sparse (tile-list) launch

Run it in a process without TRITON_INTERPRET (the interpreter cannot compile).
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import tempfile
from pathlib import Path

MMA_OPCODES = ("HGMMA", "IGMMA", "QGMMA")


def compile_plain(block_d: int, pv: str = "fp8", tile: tuple[int, int] | None = None,
                  warps_stages: tuple[int, int] | None = None, by_add: bool | None = None,
                  maxnreg: int | None = None, sparse: bool = False):
    """The plain kernel for the `pv` plan at `block_d` (or another `tile` (BLOCK_M, BLOCK_N) and
    `warps_stages`; `by_add`: scores converted by an integer add or not, `maxnreg`: a register cap,
    0 none; None: both as the sm90 plan; `sparse`: the block-sparse launch, MODE "sparse", whose
    scores are converted exactly), with the specializations a real launch gets (16-byte aligned
    pointers, sizes and strides divisible by 16): without them Triton cannot prove alignment and
    loads K/V byte by byte, which no launch does."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from sagevideo.kernels.attention_fwd import _attn_fwd_kernel
    from sagevideo.kernels.plans import launch, max_registers, scores_by_add, tiles

    block_m, block_n = tile or tiles(pv, block_d)
    num_warps, num_stages = warps_stages or launch("sm90", block_d, pv)
    pointers = ("QQ", "QScale", "QShift", "KQ", "KScale", "KScaleMax", "Work", "V", "VQ", "VScale", "VRange",
                "Mask", "MaskPrefix", "Out", "Lse", "KeyTiles", "Counts", "Order")
    types = ("*i8", "*fp32", "*fp32", "*i8", "*fp32", "*i32", "*i32", "*bf16", "*fp8e4nv", "*fp32", "*fp32", "*u8",
             "*i32", "*bf16", "*fp32", "*i32", "*i32", "*i32")
    list_strides = ("stride_tb", "stride_th", "stride_tm", "stride_cb", "stride_ch", "stride_cm")
    ints = ("stride_vb", "stride_vh", "stride_vn", "stride_ob", "stride_oh", "stride_om", "mask_stride_b",
            *list_strides, "H", "H_KV", "N_Q", "N_K", "M_PAD", "N_PAD", "N_ITEMS")
    signature = {**dict(zip(pointers, types, strict=True)), **dict.fromkeys(ints, "i32")}
    constexprs = dict(HEAD_DIM=block_d, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d,
                      CAUSAL=False, HAS_MASK=False, PER_TOKEN_K=False, FP8_PV=pv == "fp8", STORE_LSE=False,
                      WIDE_OFFSETS=False,
                      MODE="add" if (scores_by_add("sm90", block_d, pv) if by_add is None else by_add) else "exact")
    if sparse:
        constexprs["MODE"] = "sparse"
    signature.update(dict.fromkeys(constexprs, "constexpr"))
    # a list row's stride is its width (any), the counts' and items' counts any
    unaligned = ("mask_stride_b", "H", "H_KV", "N_ITEMS", *list_strides)
    aligned = [*pointers, *(n for n in ints if n not in unaligned)]
    names = _attn_fwd_kernel.arg_names
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in aligned}
    source = ASTSource(fn=_attn_fwd_kernel, signature=signature, constexprs=constexprs, attrs=attrs)
    options = {"num_warps": num_warps, "num_stages": num_stages}
    cap = max_registers("sm90", block_d, pv) if maxnreg is None else maxnreg
    if cap:
        options["maxnreg"] = cap
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)


def compile_gluon(block_d: int, pv: str = "fp8", tile=None, warps_stages=None, by_add: bool | None = None,
                  maxnreg: int | None = None, sparse: bool = False):
    """The Gluon kernel with the sm90 plan's ring stages (FP8 PV only; the plain kernel's options do
    not apply)."""
    from sagevideo.kernels.attention_sm90 import compile_for_sm90
    from sagevideo.kernels.plans import gluon_stages

    return compile_for_sm90(block_d, num_stages=gluon_stages(block_d))


def cuobjdump(cubin: bytes, flag: str) -> str:
    """Output of the cuobjdump that ships with Triton (`flag`: -sass, -res-usage) on a cubin."""
    import triton

    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(cubin)
    try:
        return subprocess.run([str(tool), flag, f.name], capture_output=True, text=True, check=True).stdout
    finally:
        os.unlink(f.name)


def disassemble(cubin: bytes) -> str:
    return cuobjdump(cubin, "-sass")


def resources(compiled) -> str:
    """Registers and stack from cuobjdump -res-usage (a stack above 0 means spills) and the shared
    memory the launch takes. For the Gluon kernel the registers are the launch count: its
    consumers raise theirs with setmaxnreg."""
    usage = cuobjdump(compiled.asm["cubin"], "-res-usage")
    regs, stack = (re.search(rf"{key}:(\d+)", usage).group(1) for key in ("REG", "STACK"))
    return f"registers {regs} (at launch), stack {stack} B, shared {compiled.metadata.shared} B"


PREDICATE = r"^@!?U?P\w+\s+"


def instructions(sass: str, keep_predicates: bool = False) -> list[tuple[int, str]]:
    """(address, instruction text) of every instruction in cuobjdump -sass output, in order; the
    guard predicate (@P0, @!UP1, ...) removed unless `keep_predicates`."""
    found = [(int(m.group(1), 16), m.group(2).strip())
             for m in re.finditer(r"/\*([0-9a-f]{4,6})\*/\s+([^;]*);", sass)]
    return found if keep_predicates else [(addr, re.sub(PREDICATE, "", text)) for addr, text in found]


def mma_loops(sass: str) -> list[tuple[int, int, collections.Counter]]:
    """(start, end, opcode counts) of every innermost loop whose body issues an MMA. A loop ends in a
    predicated backward branch; unconditional ones are jumps back from out-of-line code (mbarrier
    wait slow paths), not loops."""
    lines = instructions(sass, keep_predicates=True)
    loops = []
    for addr, text in lines:
        branch = re.search(PREDICATE + r"BRA\b.*?(0x[0-9a-f]+)", text)
        if branch and int(branch.group(1), 16) < addr:
            start = int(branch.group(1), 16)
            body = (re.sub(PREDICATE, "", t) for a, t in lines if start <= a <= addr)
            opcodes = collections.Counter(t.split()[0].split(".")[0] for t in body if t.strip())
            if any(op in opcodes for op in MMA_OPCODES):
                loops.append((start, addr, opcodes))
    # innermost only: a branch back over a whole loop nest (the warp-specialized partitions' code) is
    # not a loop of interest
    return [loop for loop in loops if not any(loop[0] <= o[0] and o[1] <= loop[1] and o != loop for o in loops)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kernels", default="plain,gluon", help="comma list of plain, gluon")
    parser.add_argument("--dims", default="64,128", help="comma list of head dims (64, 128)")
    parser.add_argument("--pv", default="fp8", choices=("fp8", "fp16"), help="PV mode (the Gluon kernel: fp8 only)")
    parser.add_argument("--top", type=int, default=14, help="opcodes shown per loop")
    parser.add_argument("--sass", type=Path, help="folder to write each kernel's full SASS into")
    parser.add_argument("--tile", help="plain kernel: BLOCK_MxBLOCK_N instead of the plan's, e.g. 64x128")
    parser.add_argument("--launch", help="plain kernel: WARPSxSTAGES instead of the plan's, e.g. 8x3")
    parser.add_argument("--maxnreg", type=int,
                        help="plain kernel: register cap per thread (0: none) instead of the plan's")
    parser.add_argument("--scores-by-add", choices=("plan", "on", "off"), default="plan",
                        help="int32 scores to fp32 by an integer add (on) or I2F (off); plan: as the sm90 plan")
    parser.add_argument("--sparse", action="store_true",
                        help="plain kernel: the block-sparse launch (tile lists, persistent grid)")
    args = parser.parse_args()
    tile = tuple(map(int, args.tile.split("x"))) if args.tile else None
    warps_stages = tuple(map(int, args.launch.split("x"))) if args.launch else None
    if (tile or warps_stages) and "gluon" in args.kernels.split(","):
        parser.error("--tile/--launch apply to the plain kernel: use --kernels plain")
    by_add = {"plan": None, "on": True, "off": False}[args.scores_by_add]
    variant = "".join(f"-{x[0]}x{x[1]}" for x in (tile, warps_stages) if x)  # in labels and file names
    variant += "" if by_add is None else f"-add-{args.scores_by_add}"
    variant += "" if args.maxnreg is None else f"-maxnreg{args.maxnreg}"
    if args.maxnreg is not None and "gluon" in args.kernels.split(","):
        parser.error("--maxnreg applies to the plain kernel: use --kernels plain")
    if args.pv == "fp16" and "gluon" in args.kernels.split(","):
        parser.error("the Gluon kernel has FP8 PV only: use --kernels plain with --pv fp16")
    if args.sparse and "gluon" in args.kernels.split(","):
        parser.error("the Gluon kernel takes no tile lists: use --kernels plain with --sparse")
    variant += "-sparse" if args.sparse else ""
    compilers = {"plain": compile_plain, "gluon": compile_gluon}
    for name in args.kernels.split(","):
        for block_d in map(int, args.dims.split(",")):
            compiled = compilers[name](block_d, args.pv, tile, warps_stages, by_add, args.maxnreg, args.sparse)
            sass = disassemble(compiled.asm["cubin"])
            label = f"{name}{variant} d{block_d} {args.pv}"
            print(f"{label}: {resources(compiled)}")
            if args.sass:
                args.sass.mkdir(parents=True, exist_ok=True)
                (args.sass / f"{name}{variant}-d{block_d}.sass").write_text(sass)
            for start, end, opcodes in mma_loops(sass):
                mix = ", ".join(f"{op} {n}" for op, n in opcodes.most_common(args.top))
                print(f"{label} loop {start:#x}-{end:#x}: {sum(opcodes.values())} instructions; {mix}")


if __name__ == "__main__":
    main()
