#!/usr/bin/env python3
"""Side-by-side attention throughput on one GPU: SDPA backends vs sagevideo (and PyPI sageattention).

TOPS = 4·B·H·N²·D / median time, non-causal, random fp16 inputs (`--dtype bf16`: bf16, as the
models run) with a K channel offset (never zeros), every variant in the same run. Each variant is
timed `--reps` times (triton.testing.do_bench medians) in round-robin order and the median of those
is reported: the H200's clock drifts by several percent within a run, and interleaving spreads the
drift over every variant alike. Ratios are against SDPA's cuDNN backend (the best 16-bit attention
on Hopper). For sagevideo, "call" is the full `sageattn` call as users make it (quantization
included) and "kernel" the attention kernel alone on pre-quantized inputs. Accuracy: cosine vs
fp32 SDPA (worst over heads) for every sagevideo mode.

    python -m bench.bench_attention --json bench.json [--shapes cogvideox-2b,...] [--sweep cogvideox-2b]
    python -m bench.bench_attention --shapes cogvideox-2b --sweep cogvideox-2b --sweep-pv fp8 \
        --sweep-tiles 128x128,64x128 --sweep-launch 4x3,4x2 --sweep-adds on,off
    python -m bench.bench_attention --append-results          # also add the rows to bench/results.jsonl
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import itertools
import json
import platform
import sys
from pathlib import Path

import torch

if not __package__:  # run as a file (python bench/bench_attention.py): `bench` from the repo root, as with -m
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.results import Run, add_results_option, start_run, variant  # noqa: E402
from sagevideo.experiments.bench.attention import (  # noqa: E402
    AttentionShape,
    attention_inputs,
    reference_fp32,
    sdpa_call,
)
from sagevideo.experiments.bench.attention import tops as attention_tops  # noqa: E402
from sagevideo.experiments.bench.timing import cosine_worst, interleaved, median  # noqa: E402

SHAPES = {
    "cogvideox-2b": (2, 30, 17776, 64),
    "cogvideox-5b": (2, 48, 17776, 64),
    "d128-8k": (2, 24, 8192, 128),
    "d128-32k": (1, 24, 32768, 128),
    "d128-75k": (1, 24, 75000, 128),
    # Open-Sora 2.0, 129 frames 16:9 (docs/opensora.md): joint text + video sequence. cuDNN is
    # ~7% faster at 76544 (a multiple of 128) than at 75000 (docs/benchmarks-history.md, "the table's
    # protocol flatters the d128 ratios").
    "opensora-256px": (1, 24, 8828, 128),
    "opensora-768px": (1, 24, 76544, 128),
    "wan-720p": (1, 40, 75600, 128),  # Wan 2.1 14B, 81 frames at 720p: the sparse targets' shape
}
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
DEFAULT_SHAPES = "cogvideox-2b,cogvideox-5b,d128-8k,d128-32k"
SDPA_BACKENDS = ("flash", "cudnn", "efficient")


def square(shape: tuple[int, int, int, int]) -> AttentionShape:
    """(B, H, N, D) as self-attention's shape."""
    b, h, n, d = shape
    return AttentionShape(b, h, n, n, d)


def tops(shape: tuple[int, int, int, int], ms: float) -> float:
    return attention_tops(square(shape).flops, ms)


def bench_ms(fn) -> float:
    from triton.testing import do_bench

    return do_bench(fn, warmup=25, rep=100, return_mode="median")


def bench_inputs(shape: tuple[int, int, int, int], dtype: torch.dtype = torch.float16):
    """q, k, v (B, H, N, D) in `dtype` on the GPU (`sagevideo.experiments.bench.attention.attention_inputs`)."""
    return attention_inputs(square(shape), "cuda", dtype)


def direct(fn):
    """`fn` launching its Triton kernels directly, as the registered op does in eager mode: through
    the wrap_triton HOP each launch costs ~0.2 ms of Python and the timing is of the CPU."""
    from torch._library.triton import set_wrap_triton_enabled

    def run():
        with set_wrap_triton_enabled(False):
            return fn()

    return run


def bench_interleaved(fns: dict, reps: int) -> tuple[dict, dict, dict]:
    """Time every fn `reps` times, round-robin, with `bench_ms`. Returns (median ms per name, all ms
    per name, error per name that failed; a failing fn is dropped after its first error)."""
    runs, errors = interleaved(fns, reps, lambda fn: bench_ms(fn))
    return {name: median(ms) for name, ms in runs.items()}, runs, errors


def bench_shape(name: str, shape, sweep: SweepSpace | None, reps: int = 3, dtype: torch.dtype = torch.float16) -> dict:
    """One row of the table; `sweep`: also time the plain kernel's variants in that space."""
    from torch._library.triton import set_wrap_triton_enabled

    from sagevideo import last_backend, sageattn
    from sagevideo.kernels.op import attention_kernel
    from sagevideo.kernels.plans import select_plan
    from sagevideo.kernels.quantize import quantize_inputs
    from sagevideo.kernels.rotation import hadamard_pm1

    b, h, n, d = shape
    q, k, v = bench_inputs(shape, dtype)
    row: dict = {"shape": name, "B": b, "H": h, "N": n, "D": d, "dtype": str(dtype).removeprefix("torch."),
                 "tops": {}, "ms": {}, "cos_worst": {}}
    timed: dict = {f"sdpa-{backend}": sdpa_call(backend, q, k, v) for backend in SDPA_BACKENDS}
    try:
        from sageattention import sageattn as pypi_sageattn  # PyPI sageattention 1.0.x, if installed

        timed["pypi-sageattention"] = lambda: pypi_sageattn(q, k, v, tensor_layout="HND")
    except ImportError:
        pass

    ref = reference_fp32(q, k, v)
    for pv in ("fp16", "fp8"):
        out = sageattn(q, k, v, pv=pv, backend="triton")
        row.setdefault("kernel", {})[pv] = last_backend().ran  # "triton", or "gluon" (SAGEVIDEO_SM90_KERNEL)
        assert last_backend().ran in ("triton", "gluon")
        row["cos_worst"][pv] = cosine_worst(ref, out)
        timed[f"sage-{pv}-call"] = lambda pv=pv: sageattn(q, k, v, pv=pv, backend="triton")
        plan = select_plan(q.device, d, pv).plan
        rot = hadamard_pm1(plan.block_d, q.device, q.dtype)

        def quantize(plan=plan, rot=rot):
            return quantize_inputs(q, k, v, None, rot, plan, sm_scale=d**-0.5, per_token=False,
                                   smooth_k=True, need_shift=False)

        with set_wrap_triton_enabled(False):  # direct launches (see `direct`)
            prepared = quantize()
            row.setdefault("prep_kernels_ms", {})[pv] = prep_kernel_times(quantize)
        o = torch.empty_like(q)
        timed[f"sage-{pv}-quant"] = direct(quantize)
        timed[f"sage-{pv}-kernel"] = direct(lambda prepared=prepared, o=o, plan=plan: attention_kernel(
            prepared, v, None, o, None, plan, is_causal=False, per_token=False, n_q=n, n_k=n))
        if sweep and pv in sweep.pv_modes:
            row.setdefault("sweep", {})[pv] = sweep_plans(q, k, v, plan, shape, sweep)
    row["ms"], row["ms_reps"], errors = bench_interleaved(timed, reps)
    for key in timed:
        row["ms"].setdefault(key, None)
    if errors:
        row["errors"] = errors
    cudnn = row["ms"].get("sdpa-cudnn")
    row["tops"] = {key: (tops(shape, ms) if ms else None) for key, ms in row["ms"].items()}
    row["vs_cudnn"] = {key: (cudnn / ms if ms and cudnn else None) for key, ms in row["ms"].items()}
    return row


def prep_kernel_times(quantize) -> dict:
    """Device time (ms, mean of 20 runs) of each preparation kernel, from the CUDA profiler."""
    from torch.profiler import ProfilerActivity, profile

    quantize()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(20):
            quantize()
        torch.cuda.synchronize()
    times: dict = {}
    for event in prof.key_averages():
        if event.device_type.name == "CUDA" and "kernel" in event.key:
            times[event.key] = round(event.device_time_total / 1e3 / 20, 4)
    return times


@dataclasses.dataclass
class SweepSpace:
    """What `--sweep` varies: the plain kernel's tiles, (warps, stages), PV modes, and its
    `scores_by_add` as the plan has it ("plan") or forced "on"/"off"."""

    tiles: tuple = ((64, 64), (128, 64), (64, 128), (128, 128))
    launches: tuple = ((4, 2), (4, 3), (8, 3))
    pv_modes: tuple = ("fp16", "fp8")
    adds: tuple = ("plan",)


def sweep_plans(q, k, v, plan, shape, space: SweepSpace) -> list[dict]:
    """Kernel-only time of every tile/warps/stages variant, and the preparation time of each tile
    variant (tiles change the quantization groups, so each tile variant is re-quantized first)."""
    from torch._library.triton import set_wrap_triton_enabled

    from sagevideo.kernels.attention_fwd import attention_forward
    from sagevideo.kernels.plans import plain_plan
    from sagevideo.kernels.quantize import quantize_inputs
    from sagevideo.kernels.rotation import hadamard_pm1

    n, d = shape[2], shape[3]
    rot = hadamard_pm1(plan.block_d, q.device, q.dtype)
    rows = []
    for bm, bn in space.tiles:
        tiled = plain_plan(plan.arch, plan.block_d, plan.pv, bm, bn)  # the plain kernel's plan for these tiles

        def quantize(tiled=tiled):
            return quantize_inputs(q, k, v, None, rot, tiled, sm_scale=d**-0.5, per_token=False,
                                   smooth_k=True, need_shift=False)

        try:
            with set_wrap_triton_enabled(False):  # launch overhead, not device time, otherwise (see `direct`)
                prepared = quantize()
                prep_ms = bench_ms(quantize)
        except Exception as exc:  # a tile the preparation cannot take: record it, go on
            rows.append({"block_m": bm, "block_n": bn, "error": str(exc).splitlines()[0][:160]})
            continue
        o = torch.empty_like(q)
        for (warps, stages), add in itertools.product(space.launches, space.adds):
            by_add = tiled.scores_by_add if add == "plan" else add == "on"
            cand = dataclasses.replace(tiled, num_warps=warps, num_stages=stages, scores_by_add=by_add)
            entry = {"block_m": bm, "block_n": bn, "warps": warps, "stages": stages, "prep_ms": prep_ms,
                     "scores_by_add": by_add, "max_registers": cand.max_registers}
            if by_add and not tiled.scores_by_add:  # the guard reads K scale maxima the plan did not track
                with set_wrap_triton_enabled(False):
                    prepared_add = quantize_inputs(q, k, v, None, rot, cand, sm_scale=d**-0.5, per_token=False,
                                                   smooth_k=True, need_shift=False)
            else:
                prepared_add = prepared
            try:
                with set_wrap_triton_enabled(False):
                    ms = bench_ms(lambda cand=cand, prepared=prepared_add, o=o: attention_forward(
                        prepared, v, None, o, None, cand, is_causal=False, per_token=False, n_q=n, n_k=n))
                entry.update(ms=ms, tops=tops(shape, ms))
            except Exception as exc:  # e.g. out of shared memory
                entry["error"] = str(exc).splitlines()[0][:160]
            rows.append(entry)
        del prepared
    return rows


def versions() -> dict:
    import triton

    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "gpu": torch.cuda.get_device_name(),
        "capability": list(torch.cuda.get_device_capability()),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
        "triton": triton.__version__,
        "python": platform.python_version(),
    }


def print_table(rows: list[dict]) -> None:
    cols = ["sdpa-flash", "sdpa-cudnn", "pypi-sageattention", "sage-fp16-call", "sage-fp16-kernel",
            "sage-fp8-call", "sage-fp8-kernel"]
    print("\nTOPS (x vs SDPA cuDNN), same run:")
    print("| shape | " + " | ".join(cols) + " | fp16/fp8 call ÷ PyPI | prep kernels ms fp16/fp8 (share of call) "
          "| worst cos fp16/fp8 |")
    print("|---" * (len(cols) + 4) + "|")
    for r in rows:
        cells = []
        for c in cols:
            t, x = r["tops"].get(c), r["vs_cudnn"].get(c)
            cells.append("-" if t is None else f"{t:.0f} ({x:.2f}x)")
        prep = {pv: sum(r["prep_kernels_ms"][pv].values()) for pv in ("fp16", "fp8")}
        shares = " / ".join(f"{prep[pv]:.3f} ({prep[pv] / r['ms'][f'sage-{pv}-call']:.0%})" for pv in ("fp16", "fp8"))
        cos = "/".join(f"{r['cos_worst'][pv]:.5f}" for pv in ("fp16", "fp8"))
        dims = f"{r['shape']} ({r['B']},{r['H']},{r['N']},{r['D']}) {r.get('dtype', 'float16')}"
        pypi = r["ms"].get("pypi-sageattention")
        vs_pypi = "/".join(f"{pypi / r['ms'][f'sage-{pv}-call']:.3f}" for pv in ("fp16", "fp8")) if pypi else "-"
        print(f"| {dims} | " + " | ".join(cells) + f" | {vs_pypi} | {shares} | {cos} |")


def result_rows(run: Run, rows: list[dict]) -> Run:
    """`bench_shape` rows as results-file rows, named as the older runs' converted rows are:
    per timed variant `ms` (its repetitions in extra) and `tops` (not for the preparation-only
    "-quant"), `cos_worst` on sage-PV-call, the profiled preparation as sage-PV-prep `ms` (per-kernel
    times in extra), sweep variants as sage-PV-kernel[block_m=..,...], a failed variant as `error` = 1.
    Ratios to cuDNN are not stored (`bench.results.speedup`). fp16 inputs (the default) leave the
    variant names bare; other dtypes are a parameter: sage-fp8-call[dtype=bf16]."""
    for r in rows:
        shape, dtype = r["shape"], r.get("dtype", "float16")
        tag = {} if dtype == "float16" else {"dtype": {"bfloat16": "bf16"}.get(dtype, dtype)}
        kernel, reps = r.get("kernel", {}), r.get("ms_reps", {})
        for key, ms in r["ms"].items():
            which = next((kernel[pv] for pv in kernel if key == f"sage-{pv}-kernel"), None)
            run.add(shape, variant(key, **tag), "ms", ms, reps=reps.get(key), kernel=which)
            if not key.endswith("-quant"):  # attention FLOPs over the preparation's time: not a figure
                run.add(shape, variant(key, **tag), "tops", r["tops"].get(key), kernel=which)
        for key, error in r.get("errors", {}).items():
            run.add(shape, variant(key, **tag), "error", 1, unit="count", error=error)
        for pv, cos in r.get("cos_worst", {}).items():
            run.add(shape, variant(f"sage-{pv}-call", **tag), "cos_worst", cos)
        for pv, kernels in r.get("prep_kernels_ms", {}).items():
            run.add(shape, variant(f"sage-{pv}-prep", **tag), "ms", round(sum(kernels.values()), 4),
                    kernels_ms=kernels)
        for pv, entries in r.get("sweep", {}).items():
            for entry in entries:
                params = {k: x for k, x in entry.items() if k not in ("ms", "tops", "prep_ms", "error")}
                name = variant(f"sage-{pv}-kernel", **params, **tag)
                run.add(shape, name, "ms", entry.get("ms"), prep_ms=entry.get("prep_ms"))
                run.add(shape, name, "tops", entry.get("tops"))
                if "error" in entry:
                    run.add(shape, name, "error", 1, unit="count", error=entry["error"])
    return run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default=DEFAULT_SHAPES, help=f"comma list of {sorted(SHAPES)}")
    parser.add_argument("--json", help="write all figures to this JSON file")
    add_results_option(parser)
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="fp16",
                        help="inputs' dtype (models run bf16; cuDNN is 2-4%% faster in bf16 at d128)")
    parser.add_argument("--reps", type=int, default=3,
                        help="round-robin repetitions per variant (median reported)")
    parser.add_argument("--sweep", help="comma list of shapes on which to also time tile/warps/stages variants")
    parser.add_argument("--sweep-tiles", help="sweep only these tiles, e.g. 128x128,64x128")
    parser.add_argument("--sweep-launch", help="sweep only these WARPSxSTAGES, e.g. 4x3,4x2")
    parser.add_argument("--sweep-pv", default="fp16,fp8", help="PV modes to sweep")
    parser.add_argument("--sweep-adds", default="plan",
                        help="scores converted by an integer add: plan (as the plan has it), on, off, or on,off")
    args = parser.parse_args(argv)
    if args.reps < 1:
        parser.error(f"--reps {args.reps}: at least 1")

    def pairs(option: str, spec: str) -> tuple:
        try:
            values = tuple(tuple(int(x) for x in item.split("x")) for item in spec.split(","))
        except ValueError:
            values = ()
        if not values or any(len(v) != 2 for v in values):
            parser.error(f"{option} {spec!r}: comma list of AxB, e.g. 64x128,128x128")
        return values

    space = SweepSpace(pv_modes=tuple(args.sweep_pv.split(",")), adds=tuple(args.sweep_adds.split(",")))
    if args.sweep_tiles:
        space.tiles = pairs("--sweep-tiles", args.sweep_tiles)
        if any(bn % 32 for _, bn in space.tiles):  # mma_key_order works on 32-key groups
            parser.error(f"--sweep-tiles {args.sweep_tiles!r}: BLOCK_N must be a multiple of 32")
    if args.sweep_launch:
        space.launches = pairs("--sweep-launch", args.sweep_launch)
    if set(space.adds) - {"plan", "on", "off"}:
        parser.error(f"--sweep-adds {args.sweep_adds!r}: plan, on, off, or a comma list")
    if set(space.pv_modes) - {"fp16", "fp8"}:
        parser.error(f"--sweep-pv {args.sweep_pv!r}: fp16, fp8 or both")
    given = [o for o, v in (("--sweep-tiles", args.sweep_tiles), ("--sweep-launch", args.sweep_launch),
                            ("--sweep-adds", args.sweep_adds != "plan")) if v]
    if given and not args.sweep:
        parser.error(f"{', '.join(given)} without --sweep: name the shapes to sweep")
    if not torch.cuda.is_available():
        print("bench_attention: needs a CUDA GPU", file=sys.stderr)
        return 2
    names = [s.strip() for s in args.shapes.split(",") if s.strip()]
    unknown = [s for s in names if s not in SHAPES]
    if unknown:
        print(f"bench_attention: unknown shapes {unknown}; choose from {sorted(SHAPES)}", file=sys.stderr)
        return 2
    meta = versions()
    rows = []
    for name in names:
        rows.append(bench_shape(name, SHAPES[name], space if name in (args.sweep or "").split(",") else None,
                                args.reps, DTYPES[args.dtype]))
        print(json.dumps({"shape": name, "tops": rows[-1]["tops"]}), flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"meta": meta, "rows": rows}, fh, indent=2)
    if args.append_results:
        added = result_rows(start_run("bench_attention", meta["gpu"], argv), rows).append(args.append_results)
        print(f"bench_attention: {added} rows appended to {args.append_results}")
    print(f"\n{meta['gpu']} (sm{''.join(map(str, meta['capability']))}), torch {meta['torch']}, "
          f"triton {meta['triton']}, cuDNN {meta['cudnn']}, {meta['date']}")
    print_table(rows)
    for r in rows:
        for pv, entries in r.get("sweep", {}).items():
            ok = sorted((e for e in entries if "tops" in e), key=lambda e: -e["tops"])[:6]
            best = ", ".join(f"{e['block_m']}x{e['block_n']} w{e['warps']}s{e['stages']}"
                             f"{' add' if e['scores_by_add'] else ' i2f'}: {e['tops']:.0f} "
                             f"(prep {e['prep_ms']:.3f} ms)" for e in ok)
            print(f"sweep {r['shape']} {pv}: {best}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
