#!/usr/bin/env python3
"""The full `sageattn` call of this checkout against an earlier commit's, side by side in one run.

A change that must not slow anything down is checked against the commit before it in the same
process, round-robin with SDPA's cuDNN backend (the H200's clock drifts by several percent within
a run, so separate runs cannot show a difference of a few percent). The earlier commit's package
is imported as `sagevideo_base` (its ops registered under that namespace), so both stand side by
side.

    python -m bench.bench_ab_commit --prepare 0a492ef          # here: writes .bench-base/ (git-ignored)
    python -m bench.bench_ab_commit --shapes cogvideox-2b,opensora-768px --pv fp8,fp16 --reps 3 \
        --json ab.json [--append-results]                         # on the GPU, with .bench-base carried

Reported per shape and PV mode: median ms of each (reps round-robin medians of do_bench medians),
head ÷ base speed (above 1: this checkout is faster), both × cuDNN, and which backend each ran.
"""

from __future__ import annotations

import argparse
import functools
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

if not __package__:  # run as a file (python bench/bench_ab_commit.py): `bench` from the repo root, as with -m
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.results import Run, add_results_option, start_run, variant  # noqa: E402

BASE_DIR = ".bench-base"  # at the repository root; .gitignore lists it
BASE_PACKAGE = "sagevideo_base"


def prepare(commit: str, root: Path) -> Path:
    """Extract `commit`'s sagevideo package into root/.bench-base/sagevideo_base, renamed throughout."""
    target = root / BASE_DIR
    with tempfile.TemporaryDirectory() as tmp:
        archive = subprocess.run(["git", "-C", str(root), "archive", commit, "sagevideo"], check=True,
                                 capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
        if target.exists():
            subprocess.run(["rm", "-rf", str(target)], check=True)
        target.mkdir()
        (Path(tmp) / "sagevideo").rename(target / BASE_PACKAGE)
    for path in (target / BASE_PACKAGE).rglob("*.py"):
        path.write_text(re.sub(r"\bsagevideo\b", BASE_PACKAGE, path.read_text()))
    (target / "COMMIT").write_text(subprocess.run(["git", "-C", str(root), "rev-parse", commit], check=True,
                                                  capture_output=True, text=True).stdout)
    return target


def _part_fns(package: str, side: str, q, k, v, pv: str) -> dict:
    """{side-prep: the preparation kernels, side-kernel: the attention kernel on prepared inputs}."""
    import importlib

    import torch

    from bench.bench_attention import direct

    plans = importlib.import_module(f"{package}.kernels.plans")
    quantize = importlib.import_module(f"{package}.kernels.quantize")
    op = importlib.import_module(f"{package}.kernels.op")
    rotation = importlib.import_module(f"{package}.kernels.rotation")
    d = q.shape[-1]
    plan = plans.select_plan(q.device, d, pv).plan
    rot = rotation.hadamard_pm1(plan.block_d, q.device, q.dtype)

    def prep():
        return quantize.quantize_inputs(q, k, v, None, rot, plan, sm_scale=d**-0.5, per_token=False, smooth_k=True,
                                        need_shift=False)

    prepared = direct(prep)()
    out = torch.empty_like(q)

    def kernel():
        op.attention_kernel(prepared, v, None, out, None, plan, is_causal=False, per_token=False,
                            n_q=q.shape[2], n_k=k.shape[2])

    return {f"{side}-prep": direct(prep), f"{side}-kernel": direct(kernel)}


def result_rows(run: Run, rows: list[dict], default_dtype: str = "bf16") -> Run:
    """The A/B rows as results-file rows, named as the 2026-12-01 run's converted rows are: per timed
    function `ms` with variant SIDE[pv=PV] (cudnn, head, base; with --parts head-prep, base-kernel, ...),
    its repetitions and the backend that side ran in extra, an error as `error` = 1. The base side's
    rows name the base commit; a dtype other than bf16 (the default) is a parameter of the variant."""
    for row in rows:
        tag = {} if row["dtype"] == default_dtype else {"dtype": row["dtype"]}
        for key, ms in row["ms"].items():
            side = key.split("-")[0]
            run.add(row["shape"], variant(key, pv=row["pv"], **tag), "ms", ms, reps=row["ms_reps"].get(key),
                    ran=row["ran"].get(side), commit=row["base_commit"] if side == "base" else "run")
        for key, error in row["errors"].items():
            side = key.split("-")[0]
            run.add(row["shape"], variant(key, pv=row["pv"], **tag), "error", 1, unit="count", error=error,
                    commit=row["base_commit"] if side == "base" else "run")
    return run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prepare", metavar="COMMIT", help="extract COMMIT as the base (run here, not on the GPU)")
    parser.add_argument("--shapes", default="cogvideox-2b,cogvideox-5b,opensora-256px,opensora-768px",
                        help="comma list of bench_attention shape names")
    parser.add_argument("--pv", default="fp8,fp16", help="comma list of PV modes")
    parser.add_argument("--dtype", default="bf16", choices=("bf16", "fp16"))
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--parts", action="store_true",
                        help="also time the preparation and the attention kernel alone, for each side")
    parser.add_argument("--json", help="write the rows here")
    add_results_option(parser)
    args = parser.parse_args(argv)
    root = Path(__file__).resolve().parents[1]
    if args.prepare:
        print(f"base {args.prepare} -> {prepare(args.prepare, root)}")
        return 0
    sys.path.insert(0, str(root / BASE_DIR))
    sys.path.insert(0, str(root))
    import torch

    from bench.bench_attention import DTYPES, SHAPES, bench_inputs, bench_interleaved, direct
    from sagevideo.experiments.bench.attention import sdpa_call
    try:  # its ops under its own namespace; the layout before the rooms were renamed, or this one
        from sagevideo_base.api import attention as base_attention
        from sagevideo_base.api import backends as base_backends
    except ImportError:
        from sagevideo_base.attention import functional as base_attention
        from sagevideo_base.attention import records as base_backends

    import sagevideo

    commit = (root / BASE_DIR / "COMMIT").read_text().strip()
    rows = []
    for name in args.shapes.split(","):
        shape = SHAPES[name]
        q, k, v = bench_inputs(shape, DTYPES[args.dtype])
        for pv in args.pv.split(","):
            fns = {
                "cudnn": sdpa_call("cudnn", q, k, v),
                "base": direct(functools.partial(base_attention.sageattn, q, k, v, pv=pv, backend="triton")),
                "head": direct(functools.partial(sagevideo.sageattn, q, k, v, pv=pv, backend="triton")),
            }
            if args.parts:
                for side, package in (("head", "sagevideo"), ("base", BASE_PACKAGE)):
                    fns.update(_part_fns(package, side, q, k, v, pv))
            fns["head"]()
            ran_head = sagevideo.last_backend().label
            fns["base"]()
            ran_base = base_backends.last_backend().label
            ms, all_ms, errors = bench_interleaved(fns, args.reps)
            row = {"shape": name, "dims": shape, "dtype": args.dtype, "pv": pv, "ms": ms, "ms_reps": all_ms,
                   "errors": errors, "ran": {"head": ran_head, "base": ran_base}, "base_commit": commit,
                   "gpu": torch.cuda.get_device_name()}
            rows.append(row)
            print(json.dumps({key: row[key] for key in ("shape", "pv", "ms", "ran")}), flush=True)
        del q, k, v
        torch.cuda.empty_cache()
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    if args.append_results:
        run = start_run("bench_ab_commit", torch.cuda.get_device_name(), argv)
        added = result_rows(run, rows).append(args.append_results)
        print(f"bench_ab_commit: {added} rows appended to {args.append_results}")
    print(f"\nthis checkout (head) vs {commit[:10]} (base), {args.dtype}, median of {args.reps} round-robin runs")
    print(f"{'shape':16} {'pv':5} {'head ms':>9} {'base ms':>9} {'head÷base':>10} {'head×cuDNN':>11} "
          f"{'base×cuDNN':>11}  ran")
    for row in rows:
        ms = row["ms"]
        if not {"head", "base", "cudnn"} <= ms.keys():
            print(f"{row['shape']:16} {row['pv']:5} errors: {row['errors']}")
            continue
        print(f"{row['shape']:16} {row['pv']:5} {ms['head']:9.3f} {ms['base']:9.3f} {ms['base'] / ms['head']:10.3f} "
              f"{ms['cudnn'] / ms['head']:11.3f} {ms['cudnn'] / ms['base']:11.3f}  {row['ran']['head']}")
        if "head-prep" in ms:
            print(f"{'':22} prep {ms['head-prep']:.3f} vs {ms['base-prep']:.3f} ms, kernel {ms['head-kernel']:.3f} "
                  f"vs {ms['base-kernel']:.3f} ms (head vs base)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
