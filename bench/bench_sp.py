#!/usr/bin/env python
"""Ulysses sequence parallelism: one CogVideoX-5B-size transformer step on N GPUs against 1.

Measured: one forward of the transformer as the pipeline calls it at each denoising step:
CogVideoX-5B's config (42 layers, 48 heads x 64, random weights, built by
bench/bench_transformer.py), batch 2 (classifier-free guidance), 49 frames 480x720 = 13 latent
frames of 60x90 = 17,550 video + 226 text tokens, bf16. Per attention mode:
- 1 GPU: rank 0 runs the unsharded transformer alone (the other ranks wait at a barrier);
- N GPUs: every rank runs it sharded (`shard_cogvideox`: the [text; video] sequence split in equal
  shards, all-to-all over heads).
Same weights and inputs on every rank (rank 0's, broadcast). Time: median of --repeats forwards
after --warmup, each between torch.cuda.synchronize()s (N GPUs: ranks start together after a
barrier; a forward's time is the slowest rank's). Modes: "sage" = sagevideo attention with the
default plan (FP8 PV on sm90), "sdpa" = full-precision SDPA through the same processors.
Correctness: max |diff| and cosine of the N-GPU noise prediction against the 1-GPU one.

    torchrun --nproc-per-node 2 bench/bench_sp.py --json sp.json          # GPU (NCCL)
    torchrun --nproc-per-node 2 bench/bench_sp.py --tiny                  # CPU smoke test (gloo)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

if not __package__:  # run as a file (python bench/bench_sp.py): `bench` from the repo root, as with -m
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.bench_transformer import COGVIDEOX_5B, TINY, build  # noqa: E402  (the 5B config and inputs)


def say(line: str) -> None:
    if dist.get_rank() == 0:
        print(f"bench_sp: {line}", file=sys.stderr, flush=True)


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def barrier() -> None:
    # device_ids: NCCL otherwise guesses the GPU (and warns).
    dist.barrier(device_ids=[torch.cuda.current_device()]) if torch.cuda.is_available() else dist.barrier()


def same_everywhere(model: torch.nn.Module, inputs: dict) -> None:
    """Rank 0's weights and inputs on every rank: seeded init is not promised to match across GPUs."""
    tensors = [*model.parameters(), *model.buffers()]
    for value in inputs.values():
        tensors += [t for t in (value if isinstance(value, tuple) else (value,)) if isinstance(t, torch.Tensor)]
    for t in tensors:
        dist.broadcast(t.data, 0)


def timed(forward, warmup: int, repeats: int, together: bool) -> tuple[list[float], torch.Tensor]:
    """Seconds of each timed forward and the last output. together: all ranks run (barrier first)."""
    for _ in range(warmup):  # Triton compilation, cuBLAS/NCCL set-up
        forward()
    times = []
    for _ in range(repeats):
        sync()
        if together:
            barrier()
        start = time.perf_counter()
        out = forward()
        sync()
        times.append(time.perf_counter() - start)
    if together:  # a sharded step ends when its slowest rank does
        t = torch.tensor(times, dtype=torch.float64, device="cuda" if torch.cuda.is_available() else "cpu")
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        times = t.tolist()
    return times, out


CATEGORIES = (  # kernel (op, on CPU) name fragments -> where a step's time goes
    ("communication", ("nccl", "all_to_all", "alltoall", "gloo")),
    ("attention kernels", ("_attn_fwd", "_quantize", "_kv_stats", "flash", "fmha", "cudnn", "sageattn")),
    ("matmuls", ("gemm", "nvjet", "xmma", "cutlass", "sm90_", "aten::mm", "aten::addmm", "aten::bmm")),
)


def kernel_breakdown(forward) -> dict:
    """Time (ms) of one forward by kernel category from the profiler: CUDA kernels on a GPU, CPU
    ops' self time on CPU (smoke test). Every rank must call it (the forward has collectives)."""
    from torch.profiler import ProfilerActivity, profile

    cuda = torch.cuda.is_available()
    sync()
    with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
        forward()
        sync()
    totals: dict = {}
    for event in prof.key_averages():
        if event.device_type.name != ("CUDA" if cuda else "CPU"):
            continue
        name = event.key.lower()
        group = next((label for label, keys in CATEGORIES if any(k in name for k in keys)), "other kernels")
        spent = event.device_time_total if cuda else event.self_cpu_time_total
        totals[group] = totals.get(group, 0.0) + spent / 1e3
    return {k: round(v, 1) for k, v in sorted(totals.items())}


def main(argv: list[str] | None = None) -> int:
    import sagevideo
    from sagevideo.parallel.launch import init_from_env
    from sagevideo.pipelines.cogvideox.sequence_parallel import shard_cogvideox

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiny", action="store_true", help="tiny config on CPU over gloo (smoke test)")
    parser.add_argument("--modes", default="sage,sdpa", help="comma list of sage, sdpa")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--chunks", type=int, default=None,
                        help="head chunks pipelined through the all-to-alls (default: ulysses.HEAD_CHUNKS)")
    parser.add_argument("--profile", action="store_true",
                        help="also break one 1-GPU and one sharded forward down by kernel category (every rank's)")
    parser.add_argument("--each-gpu", action="store_true",
                        help="run the 1-GPU baseline on every rank (per-GPU speed), started together only roughly "
                             "(no barrier); rank 0's stays the baseline, measured then with the other GPUs busy")
    args = parser.parse_args(argv)

    if args.chunks is not None:
        from sagevideo.parallel import ulysses

        ulysses.HEAD_CHUNKS = args.chunks  # a speed knob of this benchmark; the output does not change
    rank, world = init_from_env("gloo" if args.tiny else "nccl")
    device = "cpu" if args.tiny else "cuda"
    dtype = torch.float32 if args.tiny else torch.bfloat16
    quantized = "reference" if args.tiny else "auto"  # CPU: the exact emulation of the kernels
    started = time.perf_counter()
    model, inputs = build(TINY if args.tiny else COGVIDEOX_5B, device, dtype)
    same_everywhere(model, inputs)
    say(f"{world} ranks; model built in {time.perf_counter() - started:.0f} s")

    def forward() -> torch.Tensor:
        with torch.no_grad():
            return model(**inputs)[0]

    results, one_outputs = {}, {}
    for mode in args.modes.split(","):
        backend = {"sage": quantized, "sdpa": "sdpa"}[mode]
        row: dict = {"backend_requested": backend}
        if rank == 0 or args.each_gpu:
            with sagevideo.install(model, backend=backend) as handle, sagevideo.record_backends() as log:
                times, out = timed(forward, args.warmup, args.repeats, together=False)
                if args.profile:
                    row["kernels_1"] = kernel_breakdown(forward)
            one_outputs[mode] = out
            plan = handle.plan.default.label if mode == "sage" else "full (SDPA)"
            row.update(plan=plan, times_1=times, backends_1=log.summary())
            say(f"{mode}: 1 GPU {statistics.median(times) * 1e3:.0f} ms ({log.counts})")
        if args.each_gpu:  # every GPU ran the unsharded step at the same time: is one of them slower?
            per_rank = [None] * world
            dist.all_gather_object(per_rank, (statistics.median(row["times_1"]) * 1e3, row.get("kernels_1")))
            row["ms_1_each_rank"] = [ms for ms, _ in per_rank]
            row["kernels_1_each_rank"] = [kernels for _, kernels in per_rank]
            say(f"{mode}: 1 GPU on each rank at once: " + ", ".join(f"{ms:.0f}" for ms, _ in per_rank) + " ms")
        barrier()  # the other ranks wait here for the 1-GPU baseline
        with shard_cogvideox(model, backend=backend), sagevideo.record_backends() as log:
            times, out = timed(forward, args.warmup, args.repeats, together=True)
            if args.profile:
                barrier()
                row["kernels_n"] = kernel_breakdown(forward)  # every rank runs it
                each = [None] * world
                dist.all_gather_object(each, row["kernels_n"])
                row["kernels_n_each_rank"] = each  # a rank that waits more in NCCL waits for a slower one
        per_rank = [None] * world
        dist.all_gather_object(per_rank, log.summary())  # a fallback on any rank shows
        row.update(times_n=times, backends_n=per_rank)
        if rank == 0:
            ref = one_outputs[mode].float()
            row.update(
                ms_1=statistics.median(row["times_1"]) * 1e3, ms_n=statistics.median(times) * 1e3,
                max_abs_diff=(out.float() - ref).abs().max().item(),
                cosine=F.cosine_similarity(out.double().flatten(), ref.double().flatten(), dim=0).item(),
            )
            row["speedup"] = row["ms_1"] / row["ms_n"]
            say(f"{mode}: {world} GPUs {row['ms_n']:.0f} ms -> {row['speedup']:.2f}x; cos {row['cosine']:.6f}")
        results[mode] = row

    if rank == 0:
        if {"sage", "sdpa"} <= set(one_outputs):  # context: quantized vs full precision, 1 GPU
            a, b = one_outputs["sage"].float().flatten(), one_outputs["sdpa"].float().flatten()
            results["sage_vs_sdpa_cosine_1gpu"] = F.cosine_similarity(a.double(), b.double(), dim=0).item()
        report = {
            "what": "one transformer forward (= one denoising step with CFG), median seconds -> ms",
            "config": "tiny (CPU, gloo)" if args.tiny else
                      "CogVideoX-5B random weights, batch 2, 49 frames 480x720 (17550+226 tokens), bf16",
            "world": world, "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
            "torch": torch.__version__, "warmup": args.warmup, "repeats": args.repeats, "modes": results,
            "total_s": time.perf_counter() - started,
        }
        if args.json:
            args.json.write_text(json.dumps(report, indent=2))
        print_table(report, world)
    dist.destroy_process_group()
    return 0


def print_table(report: dict, world: int) -> None:
    print(f"\nUlysses SP, {report['config']} on {report['gpu']}; ms per transformer step (median of "
          f"{report['repeats']}); cosine/max|diff|: {world}-GPU output vs 1-GPU output")
    print(f"{'mode':<6} {'plan':<16} {'1 GPU ms':>9} {f'{world} GPU ms':>9} {'speedup':>8} {'cosine':>9} "
          f"{'max|diff|':>9}  backends 1 GPU | {world} GPUs (per rank)")
    for mode in ("sage", "sdpa"):
        r = report["modes"].get(mode)
        if r is None:
            continue
        ran = [b["counts"] for b in r["backends_n"]]
        fallbacks = [b["fallbacks"] for b in [r["backends_1"], *r["backends_n"]] if b["fallbacks"]]
        print(f"{mode:<6} {r['plan']:<16} {r['ms_1']:>9.1f} {r['ms_n']:>9.1f} {r['speedup']:>7.2f}x "
              f"{r['cosine']:>9.6f} {r['max_abs_diff']:>9.2e}  {r['backends_1']['counts']} | {ran}"
              + (f"  FALLBACKS {fallbacks}" if fallbacks else ""))
    if "sage" in report["modes"]:
        speedup = report["modes"]["sage"]["speedup"]
        print(f"target: sage speedup >= 1.85x on 2 GPUs: {'met' if speedup >= 1.85 else 'NOT met'} "
              f"({speedup:.2f}x)" + ("  [tiny CPU run: not a measurement]" if report["gpu"] == "cpu" else ""))
    for mode in ("sage", "sdpa"):
        r = report["modes"].get(mode)
        if r and "ms_1_each_rank" in r:
            print(f"{mode} 1-GPU step on each GPU at once, ms: " + ", ".join(f"{ms:.1f}" for ms in r["ms_1_each_rank"]))
        if r and "kernels_n_each_rank" in r:
            for i, kernels in enumerate(r["kernels_n_each_rank"]):
                print(f"{mode} sharded step, rank {i} kernel time by category, ms: "
                      + ", ".join(f"{k} {v:.0f}" for k, v in kernels.items()))
        if r and "kernels_1" in r:
            print(f"{mode} kernel time by category, ms (1 GPU -> rank 0 of {world}): "
                  + ", ".join(f"{k} {r['kernels_1'].get(k, 0):.0f} -> {r['kernels_n'].get(k, 0):.0f}"
                              for k in sorted(set(r["kernels_1"]) | set(r["kernels_n"]))))
    if "sage_vs_sdpa_cosine_1gpu" in report["modes"]:
        print(f"sage vs sdpa output cosine (1 GPU): {report['modes']['sage_vs_sdpa_cosine_1gpu']:.6f}")


if __name__ == "__main__":
    sys.exit(main())
