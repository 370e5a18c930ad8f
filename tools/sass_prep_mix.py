"""Instructions per element of the preparation kernels (K/V stats, K/V and Q quantization), from
sm_90 SASS compiled on this machine, with registers and shared memory per program.

The quantization programs are as much issue- as memory-bound on the H200 (docs/benchmarks-history.md,
"a division-free preparation"): instructions per element, registers (programs per SM) and whether
loads are in flight together are the predictions a change can be checked against before any GPU time.

    python3 tools/sass_prep_mix.py                 # d64 and d128, the sm90 FP8 plans, rotation on
    python3 tools/sass_prep_mix.py --pv fp16 --no-rotate --sass /tmp/sass
    python3 tools/sass_prep_mix.py --pool          # with the tile selection's pooling (POOL) on
    python3 tools/sass_prep_mix.py --pool --spread # and the key tiles' spread (POOL_SPREAD)
    python3 tools/sass_prep_mix.py --select        # the tile selection's two kernels, per key-tile count

Run it in a process without TRITON_INTERPRET (the interpreter cannot compile).
"""

from __future__ import annotations

import argparse
import collections
import re
from pathlib import Path

from sass_loop_mix import cuobjdump, disassemble  # this script's folder is on sys.path


def compile_sm90(fn, types: dict[str, str], constexprs: dict, num_warps: int):
    """`fn` compiled for sm_90 with the divisibility a real launch proves (pointers, strides, sizes)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    signature = {**types, **dict.fromkeys(constexprs, "constexpr")}
    unaligned = {"H", "H_KV", "NUM_SPLITS", "stride_mb", "qk_scale", "sm_scale"}
    attrs = {(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in types if n not in unaligned}
    source = ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps})


def registers(cubin: bytes) -> int:
    return int(re.search(r"REG:(\d+)", cuobjdump(cubin, "-res-usage")).group(1))


def kernels(block_d: int, pv: str, rotate: bool, pool: bool = False, spread: bool = False):
    """(name, compiled kernel, elements per program) of each preparation kernel for the sm90 plan,
    launched as `plans.prep_plan` says (one K/V tile and the most Q tiles per program); pool: the K and
    Q programs also pool each tile for the tile selection (`quantize._pool_tile`, Q's `_pool_tile_gram`, one
    Q tile per pooling program: `PrepPlan.most_q_tiles`)."""
    from sagevideo.kernels import quantize as qz
    from sagevideo.kernels.plans import plain_plan, prep_plan, tiles

    block_m, block_n = tiles(pv, block_d)
    plan = plain_plan("sm90", block_d, pv, block_m, block_n)
    prep = prep_plan(plan)
    fp8_v = pv == "fp8"
    strides = {f"stride_{t}{d}": "i32" for t in "kv" for d in "bhn"}
    stats = compile_sm90(
        qz._kv_stats_kernel,
        {"K": "*bf16", "V": "*bf16", "Mask": "*u8", "KSum": "*fp32", "KCount": "*fp32", "VLo": "*fp32", "VHi": "*fp32",
         **strides,
         "stride_mb": "i32", "H": "i32", "N_K": "i32", "TOKENS_PER_SPLIT": "i32", "NUM_SPLITS": "i32"},
        dict(HEAD_DIM=block_d, BLOCK_D=block_d, CHUNK=prep.stats_chunk, HAS_MASK=False, SMOOTH_K=True),
        prep.stats_warps,
    )
    kv = compile_sm90(
        qz._quantize_kv_kernel,
        {"K": "*bf16", "V": "*bf16", "Mask": "*u8", "KMean": "*fp32", "KMeanRot": "*fp32", "VScale": "*fp32",
         "Rot": "*bf16", "KQ": "*i8", "KScale": "*fp32", "VQ": "*fp8e4nv", "KScaleMax": "*i32",
         "PoolShift": "*fp32", "KPoolMean": "*fp32", "KPoolSim": "*fp32", "KPoolCount": "*fp32",
         "KPoolSpread": "*fp32", **strides,
         "stride_mb": "i32", "H": "i32", "N_K": "i32", "N_PAD": "i32"},
        dict(HEAD_DIM=block_d, BLOCK_D=block_d, BLOCK_N=block_n, TILES_PER_PROGRAM=prep.kv_tiles_per_program,
             HAS_MASK=False, SMOOTH_K=True, ROTATE=rotate, PER_TOKEN=False, FP8_V=fp8_v,
             TRACK_MAX=plan.scores_by_add, POOL=pool, POOL_SPREAD=pool and spread),
        prep.kv_warps,
    )
    q = compile_sm90(
        qz._quantize_q_kernel,
        {"Q": "*bf16", "KMean": "*fp32", "Rot": "*bf16", "QQ": "*i8", "QScale": "*fp32", "QShift": "*fp32",
         "QPoolMean": "*fp32", "QPoolSim": "*fp32",
         "stride_qb": "i32", "stride_qh": "i32", "stride_qn": "i32", "H": "i32", "H_KV": "i32", "N_Q": "i32",
         "M_PAD": "i32",
         "qk_scale": "fp32", "sm_scale": "fp32"},
        dict(HEAD_DIM=block_d, BLOCK_D=block_d, BLOCK_M=block_m,
             TILES_PER_PROGRAM=prep.most_q_tiles(pool),
             ROTATE=rotate, PER_TOKEN=False, STORE_SHIFT=False, POOL=pool),
        prep.q_warps,
    )
    # the split length is a runtime argument: the loop body is what is counted
    return [("kv_stats (one chunk)", stats, prep.stats_chunk * block_d),
            ("quantize_kv (one tile)", kv, block_n * block_d), ("quantize_q (one tile)", q, block_m * block_d)]


def selection_kernels(block_d: int, pv: str, key_tiles=(591, 1182, 2048, 4096)):
    """(name, compiled kernel) of the tile selection's launches as `tile_select_kernel.select_lists`
    makes them for each count of key tiles (Wan 720p: 591 in 128-key tiles, 1,182 in 64-key ones)."""
    import triton

    from sagevideo.kernels import tile_select_kernel as ts
    from sagevideo.kernels.plans import tiles

    block_m, block_n = tiles(pv, block_d)
    found = [("tile_scores", compile_sm90(
        ts._tile_scores_kernel,
        {"QMean": "*fp32", "KMean": "*fp32", "KCount": "*fp32", "Scores": "*fp32", "H": "i32", "H_KV": "i32",
         "M_TILES": "i32", "N_TILES": "i32", "sm_scale": "fp32"},
        dict(BLOCK_D=block_d, SCORE_M=ts.SCORE_M, SCORE_N=ts.SCORE_N, SCORE_D=ts.SCORE_D,
             PRECISION=ts.SCORE_PRECISION), ts.SCORE_WARPS))]
    rules = ((False, ""), (True, ", per-row density"))  # top_p; a per-row density
    for count in key_tiles:
        t_pad = triton.next_power_of_2(count)
        rows = max(1, min(ts.MAX_ROWS, ts.SELECT_ELEMENTS // t_pad))
        for by_count, label in rules:
            found.append((f"select_tiles ({count} key tiles, {rows} rows{label})", compile_sm90(
                ts._select_tiles_kernel,
                {"Scores": "*fp32", "QSim": "*fp32", "KSim": "*fp32", "KSpread": "*fp32", "KCount": "*fp32",
                 "ProbeColumns": "*u8", "Indices": "*i32", "Counts": "*i32",
                 **dict.fromkeys(("H", "H_KV", "M_TILES", "N_TILES", "N_Q"), "i32"),
                 **dict.fromkeys(("top_p", "min_similarity", "max_spread", "density"), "fp32"),
                 **dict.fromkeys(("LOCAL", "SINKS", "PREFIX_Q", "PREFIX_K", "SUFFIX_Q", "SUFFIX_K"), "i32")},
                dict(BLOCK_M=block_m, BLOCK_N=block_n, ROWS=rows, T_PAD=t_pad, DIAGONAL=True, BY_COUNT=by_count,
                     HAS_PROBE=True),
                ts.SELECT_WARPS)))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dims", default="64,128", help="comma list of head dims (64, 128)")
    parser.add_argument("--pv", default="fp8", choices=("fp8", "fp16"))
    parser.add_argument("--no-rotate", action="store_true", help="without the Hadamard rotation of Q and K")
    parser.add_argument("--top", type=int, default=10, help="opcodes shown per kernel")
    parser.add_argument("--sass", type=Path, help="folder to write each kernel's full SASS into")
    parser.add_argument("--pool", action="store_true", help="with the tile selection's pooling on")
    parser.add_argument("--spread", action="store_true", help="with --pool: the key tiles' spread too")
    parser.add_argument("--select", action="store_true", help="the tile selection's kernels instead")
    args = parser.parse_args()
    if args.select:
        for block_d in map(int, args.dims.split(",")):
            for name, compiled in selection_kernels(block_d, args.pv):
                usage = cuobjdump(compiled.asm["cubin"], "-res-usage")
                stack = int(re.search(r"STACK:(\d+)", usage).group(1))
                print(f"d{block_d} {args.pv} {name}: {registers(compiled.asm['cubin'])} registers, {stack} B stack, "
                      f"{compiled.metadata.shared} B shared, {compiled.metadata.num_warps} warps")
        return
    for block_d in map(int, args.dims.split(",")):
        for name, compiled, elements in kernels(block_d, args.pv, rotate=not args.no_rotate, pool=args.pool,
                                                  spread=args.spread):
            sass = disassemble(compiled.asm["cubin"])
            if args.sass:
                args.sass.mkdir(parents=True, exist_ok=True)
                (args.sass / f"{name.split()[0]}-d{block_d}-{args.pv}.sass").write_text(sass)
            body = [re.sub(r"^@!?U?P\w+\s+", "", t) for t in re.findall(r"/\*[0-9a-f]{4,6}\*/\s+([^;]*);", sass)]
            opcodes = collections.Counter(t.split()[0].split(".")[0] for t in body if t.strip())
            opcodes.pop("NOP", None)
            threads = 32 * compiled.metadata.num_warps
            # static count: a loop body (stats chunks, Q tiles) counted once, with the prologue
            per_element = sum(opcodes.values()) * threads / elements
            mix = ", ".join(f"{op} {n}" for op, n in opcodes.most_common(args.top))
            print(f"d{block_d} {args.pv} {name}: {per_element:.1f} thread-instructions per element, "
                  f"{registers(compiled.asm['cubin'])} registers, {compiled.metadata.shared} B shared, "
                  f"{compiled.metadata.num_warps} warps; {mix}")


if __name__ == "__main__":
    main()
