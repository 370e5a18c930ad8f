#!/usr/bin/env python3
"""What the INT8 contract's run-time guard costs at the released models' attention shapes (GPU).

The guard counts query tiles past INT8's accuracy from the scales the preparation pass wrote, no
host sync: the ops launch `sagevideo.kernels.guard_count.count_flagged_tiles` (one small kernel);
`guard.flagged_tiles` is its PyTorch definition (a handful of reductions), timed beside it. Timed alone on
a real call's scales, against the whole `sageattn` call and SDPA's cuDNN backend in the same run
(bf16, random inputs: the count must be 0 there), then on the same shape made peaky (q, k x30:
every tile counted).

    python -m bench.bench_guard [--shapes cogvideox-5b,wan-720p] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

if not __package__:  # run as a file: `bench` from the repo root, as with -m
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.bench_attention import SHAPES, bench_inputs, bench_ms, direct, sdpa_call  # noqa: E402

SHAPES = {**SHAPES, "wan-720p": (1, 40, 75600, 128), "hunyuanvideo-720p": (1, 24, 119056, 128)}
DEFAULT = "cogvideox-2b,cogvideox-5b,opensora-768px,wan-720p,hunyuanvideo-720p"


def bench_guard(name: str, shape: tuple[int, int, int, int]) -> dict:
    from sagevideo import last_backend, sageattn
    from sagevideo.choices import auto_pv
    from sagevideo.kernels.guard import flagged_tiles
    from sagevideo.kernels.guard_count import count_flagged_tiles
    from sagevideo.kernels.plans import select_plan
    from sagevideo.kernels.quantize import quantize_inputs
    from sagevideo.kernels.rotation import hadamard_pm1

    q, k, v = bench_inputs(shape, torch.bfloat16)
    pv = auto_pv(q.device)
    call = direct(lambda: sageattn(q, k, v, pv=pv))
    call()
    ran = last_backend().label
    plan = select_plan(q.device, shape[3], pv).plan
    prepared = quantize_inputs(q, k, v, None, hadamard_pm1(plan.block_d, q.device, q.dtype), plan,
                               sm_scale=shape[3] ** -0.5, per_token=False, smooth_k=True, need_shift=False)

    kw = dict(block_m=plan.block_m, head_dim=shape[3], granularity="block", pv=pv)

    def guard():
        return count_flagged_tiles(prepared.q_scale, prepared.k_scale, **kw)

    def guard_torch():
        return flagged_tiles(prepared.q_scale, prepared.k_scale, **kw)

    row = {"shape": name, "ran": ran, "guard_ms": bench_ms(guard), "guard_torch_ms": bench_ms(guard_torch),
           "call_ms": bench_ms(call),
           "cudnn_ms": bench_ms(sdpa_call("cudnn", q, k, v)), "flagged_random": int(guard()),
           "flagged_random_torch": int(guard_torch())}
    sageattn(q * 30, k * 30, v, pv=pv)
    row["flagged_peaky"] = last_backend().peaky_tiles
    row["tiles"] = shape[0] * shape[1] * -(-shape[2] // plan.block_m)
    row["guard_pct"] = 100 * row["guard_ms"] / row["call_ms"]
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default=DEFAULT, help=f"comma-separated, of: {', '.join(SHAPES)}")
    parser.add_argument("--json", type=Path, help="write the rows here")
    args = parser.parse_args()
    rows = [bench_guard(name, SHAPES[name]) for name in args.shapes.split(",")]
    if args.json:
        args.json.write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "rows": rows}, indent=2))
    print(f"{'shape':20s} {'ran':12s} {'guard ms':>9s} {'torch ms':>9s} {'call ms':>9s} {'guard %':>8s} "
          f"{'x cuDNN':>8s} "
          f"{'flagged (random)':>17s} {'flagged (q,k x30)':>18s}")
    for r in rows:
        print(f"{r['shape']:20s} {r['ran']:12s} {r['guard_ms']:9.4f} {r['guard_torch_ms']:9.4f} "
              f"{r['call_ms']:9.3f} {r['guard_pct']:7.3f}% "
              f"{r['cudnn_ms'] / r['call_ms']:8.2f} {r['flagged_random']:>17d} "
              f"{str(r['flagged_peaky']) + '/' + str(r['tiles']):>18s}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
