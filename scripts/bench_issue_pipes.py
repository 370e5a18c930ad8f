#!/usr/bin/env python3
"""Throughput of the softmax's per-score instructions on this GPU, alone and in pairs.

The attention loop spends, per score, one int32->fp32 conversion (I2FP), one FFMA, one EX2 (MUFU)
and half an fp32->e4m3x2 pack (F2FP). If two of them share an execution pipe, a pair runs at the
sum of their times; if not, at the max. Each mode below is a kernel whose threads run 8
independent dependency chains of one instruction pattern (inline PTX, so the compiler cannot
swap it); the FFMA mode calibrates the clock (sm_90: 128 FFMA per clock per SM).

    python3 scripts/bench_issue_pipes.py [--json pipes.json]

Prints, per mode, warp instructions per clock per SM (FFMA = 4.0 by definition).
"""

from __future__ import annotations

import argparse
import json

import torch
import triton
import triton.language as tl

ITERS = 1024
CHAINS = 8  # independent values per thread: enough to hide each instruction's latency

FFMA = "fma.rn.f32 $0, $1, 0f3F7FFFFF, 0f3F800000;"
EX2 = "ex2.approx.ftz.f32 $0, $1;"
I2F = "cvt.rn.f32.s32 $0, $1;"
EX2_F16X2 = "ex2.approx.f16x2 $0, $1;"  # two exponentials per instruction, half precision
IADD = "add.s32 $0, $1, 1262485504;"  # the integer add that could replace I2F (+0x4B400000)
F2FP = "{ .reg .b16 t; .reg .f32 i; mov.b32 i, $1; cvt.rn.satfinite.e4m3x2.f32 t, i, i; mov.b32 $0, {t, t}; }"

# mode -> the chain's instructions per iteration (each takes and gives one 32-bit value)
MODES = {
    "ffma": [FFMA],
    "ex2": [EX2],
    "ex2.f16x2": [EX2_F16X2],
    "i2f": [I2F],
    "f2fp": [F2FP],  # with a PRMT per F2FP (the repack that keeps the chain 32-bit)
    "ex2+i2f": [EX2, I2F],
    "ex2+iadd": [EX2, IADD],
    "ex2+f2fp": [EX2, F2FP],
    "i2f+f2fp": [I2F, F2FP],
    "ex2+i2f+ffma": [EX2, I2F, FFMA],
    "ex2+iadd+ffma": [EX2, IADD, FFMA],
}


@triton.jit
def _apply(x, ASM: tl.constexpr):
    return tl.inline_asm_elementwise(ASM, "=r,r", [x], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _chain_kernel(X, ITERS: tl.constexpr, BLOCK: tl.constexpr,
                  A0: tl.constexpr, A1: tl.constexpr, A2: tl.constexpr, N_OPS: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(X + offs)
    for _ in range(ITERS):
        x = _apply(x, A0)
        if N_OPS > 1:
            x = _apply(x, A1)
        if N_OPS > 2:
            x = _apply(x, A2)
    tl.store(X + offs, x)


def _to_r(asm: str) -> str:
    # every operand travels as a 32-bit register ("r"); PTX float ops take .f32 operands, so
    # reinterpret through mov.b32 inside the asm block
    if asm.startswith(("add.s32", "{", "ex2.approx.f16x2")):
        return asm
    if asm.startswith("cvt.rn.f32.s32"):
        return "{ .reg .f32 o; cvt.rn.f32.s32 o, $1; mov.b32 $0, o; }"
    body = asm.replace("$0", "o").replace("$1", "i")
    return "{ .reg .f32 o, i; mov.b32 i, $1; " + body + " mov.b32 $0, o; }"


def run(mode: str, ops: list[str]) -> float:
    """Warp instructions (of the pattern) per clock per SM, in units where FFMA's time is known."""
    props = torch.cuda.get_device_properties(0)
    warps = 4
    block = 32 * warps * CHAINS
    ctas = props.multi_processor_count * 16
    x = torch.randint(1, 1 << 20, (ctas * block,), device="cuda", dtype=torch.int32)
    asm = [_to_r(a) for a in ops] + ["", ""]
    kernel = _chain_kernel[(ctas,)]

    def launch():
        kernel(x, ITERS=ITERS, BLOCK=block, A0=asm[0], A1=asm[1], A2=asm[2], N_OPS=len(ops), num_warps=warps)

    ms = triton.testing.do_bench(launch, warmup=50, rep=300)
    warp_instr = ctas * warps * CHAINS * ITERS * len(ops)
    return warp_instr / (ms * 1e-3) / props.multi_processor_count  # per second per SM


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the raw figures here")
    args = parser.parse_args()
    rates = {mode: run(mode, ops) for mode, ops in MODES.items()}
    clock = rates["ffma"] / 4.0  # sm_90 issues one FFMA warp instruction per clock per SM partition
    rows = []
    print(f"{'mode':<16} {'warp instr/clk/SM':>18} {'clocks per pattern/SM':>22}")
    for mode, rate in rates.items():
        per_clk = rate / clock
        pattern_clk = len(MODES[mode]) / per_clk
        rows.append({"mode": mode, "warp_instr_per_clk_per_sm": per_clk, "clocks_per_pattern": pattern_clk})
        print(f"{mode:<16} {per_clk:>18.3f} {pattern_clk:>22.3f}")
    print(f"implied clock {clock / 1e9:.3f} GHz (from FFMA)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(0), "iters": ITERS, "chains": CHAINS, "rows": rows,
                       "implied_clock_hz": clock}, f, indent=1)


if __name__ == "__main__":
    main()
