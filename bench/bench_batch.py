#!/usr/bin/env python
"""Batch throughput on Ray: the same jobs with 2 workers (one GPU each) against 1 worker.

Writes a local diffusers CogVideoX folder with random weights (`sagevideo generate --model`
accepts it): CogVideoX-2B's transformer config (30 heads x 64, --layers of 30), a VAE of the
CogVideoX architecture with half the channels and 1 layer per block (decode stays a small part of
a job), a 2-layer T5 encoder of width 4096 and sagevideo's built-in byte-level tokenizer. Then runs
--jobs jobs through `sagevideo.generate(..., address="local", workers=N)` for N = 1 and 2, each
into a fresh folder, on one local Ray instance this script starts (its start-up is not timed;
the attention kernels are compiled into Triton's disk cache first, so neither run pays for that).
Numbers (see the legend printed under the table):
- wall: `generate()` call, i.e. worker start + model load + all jobs + driver commits;
- jobs makespan: the busiest worker's summed job times (first job start to last job end, no load);
- steady: per worker, jobs / the sum of their own times (denoise + decode + mp4 write, from the
  manifest records), without the model load and without each worker's first job (warm-up:
  kernels loaded, CUDA libraries initialised); summed over workers. Ratios are 2 workers over 1.

    python -m bench.bench_batch --json batch.json   # 2 GPUs
    python -m bench.bench_batch --tiny              # CPU smoke test
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = [
    "a red panda climbing a tree", "waves breaking at sunset", "a lighthouse in a storm",
    "a night market in the rain", "a fox running through snow", "a paper boat on a river",
    "a hot air balloon over hills", "a cat asleep on a windowsill", "city traffic at dusk",
    "a field of sunflowers in wind",
]
# CogVideoX-2B's published transformer config (num_layers, sample size set from the arguments).
COGVIDEOX_2B = dict(
    num_attention_heads=30, attention_head_dim=64, in_channels=16, out_channels=16, time_embed_dim=512,
    text_embed_dim=4096, patch_size=2, temporal_compression_ratio=4, max_text_seq_length=226,
    activation_fn="gelu-approximate", timestep_activation_fn="silu", norm_elementwise_affine=True,
    norm_eps=1e-5, spatial_interpolation_scale=1.875, temporal_interpolation_scale=1.0,
    use_rotary_positional_embeddings=False,
)
VAE = dict(
    in_channels=3, out_channels=3, down_block_types=("CogVideoXDownBlock3D",) * 4,
    up_block_types=("CogVideoXUpBlock3D",) * 4, block_out_channels=(64, 128, 128, 256), latent_channels=16,
    layers_per_block=1, norm_num_groups=32, temporal_compression_ratio=4, scaling_factor=1.15258426,
    use_quant_conv=False, use_post_quant_conv=False,
)


def say(line: str) -> None:
    print(f"bench_batch: {line}", file=sys.stderr, flush=True)


def write_model(folder: Path, args: argparse.Namespace) -> None:
    """Random-weight CogVideoX folder (safetensors) for `sagevideo generate --model folder`."""
    from bench.random_models import write_cogvideox_folder

    cfg = dict(COGVIDEOX_2B, num_layers=args.layers, sample_frames=args.frames,
               sample_height=args.height // 8, sample_width=args.width // 8)
    vae = dict(VAE, sample_height=args.height, sample_width=args.width)
    write_cogvideox_folder(folder, cfg, vae, device=args.device)  # (warm_triton empties the GPU cache)


def warm_triton(args: argparse.Namespace) -> None:
    """Compile the attention kernels once here, at the jobs' shape, into Triton's on-disk cache
    (shared by every process of this user): otherwise the first batch pays the compilation in its
    wall time and the second finds it cached."""
    import torch

    import sagevideo

    tokens = 226 + ((args.frames - 1) // 4 + 1) * (args.height // 16) * (args.width // 16)
    heads = COGVIDEOX_2B["num_attention_heads"]
    q, k, v = (torch.randn(2, heads, tokens, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    sagevideo.sageattn(q, k, v, pv=args.pv)
    torch.cuda.synchronize()
    say(f"attention kernels warmed up ({sagevideo.last_backend().label}, {tokens} tokens)")
    del q, k, v
    torch.cuda.empty_cache()  # the workers need the GPUs, not this process


def run(n: int, model: str, out: Path, args: argparse.Namespace) -> dict:
    """One batch on `n` Ray workers; the records and what they add up to."""
    import sagevideo

    shutil.rmtree(out, ignore_errors=True)  # fresh: a manifest there would make generate skip jobs
    jobs = [{"prompt": PROMPTS[i % len(PROMPTS)], "seed": i} for i in range(args.jobs)]
    size = {} if args.tiny else dict(frames=args.frames, height=args.height, width=args.width, steps=args.steps)
    start = time.perf_counter()
    # address="local": Ray even for 1 worker (workers=1 alone would run in this process).
    records = sagevideo.generate(jobs, model=model, out=out, address="local", workers=n, progress=False,
                                 device=args.device, pv=args.pv, **size)
    wall = time.perf_counter() - start
    workers: dict[str, dict] = {}
    attention: dict[str, int] = {}
    fallbacks: dict[str, int] = {}
    for r in records:
        who = r.get("worker") or {}  # None: a job no worker finished
        w = workers.setdefault(f"{who.get('host')}:{who.get('pid')}", {"jobs": 0, "load_s": 0.0, "job_s": []})
        for label, calls in (r.get("backends") or {}).get("counts", {}).items():
            attention[label] = attention.get(label, 0) + calls
        for reason, calls in (r.get("backends") or {}).get("fallbacks", {}).items():
            fallbacks[reason] = fallbacks.get(reason, 0) + calls
        t = r.get("timings") or {}
        w["load_s"] += t.get("load_s") or 0.0
        if r["status"] != "done":
            continue
        w["jobs"] += 1
        # The load is charged to a worker's first job, which also pays one-off warm-up costs.
        w["job_s"].append((t["load_s"] > 0, t["denoise_s"] + t["decode_s"] + t["write_s"]))
    steady = 0.0
    for w in workers.values():
        warm = [s for first, s in w["job_s"] if not first] or [s for _, s in w["job_s"]]
        steady += len(warm) / sum(warm) * 60 if warm else 0.0
        w["job_s"] = [round(s, 3) for _, s in w["job_s"]]
    # From a worker's first job start to its last job's end (jobs follow each other without gaps).
    makespan = max((sum(w["job_s"]) for w in workers.values()), default=0.0)
    done = sum(r["status"] == "done" for r in records)
    all_job_s = [s for w in workers.values() for s in w["job_s"]]
    return {
        "workers": n, "jobs": len(records), "done": done, "wall_s": wall, "jobs_per_min_wall": done / wall * 60,
        "makespan_s": makespan, "steady_jobs_per_min": steady, "mean_job_s": sum(all_job_s) / max(len(all_job_s), 1),
        "max_load_s": max((w["load_s"] for w in workers.values()), default=0.0),
        "per_worker": workers, "attention": attention, "fallbacks": fallbacks,
        "errors": [r["error"] for r in records if r["status"] != "done"],
        "records": [{k: r.get(k) for k in ("job_id", "prompt", "status", "worker", "timings", "backends")}
                    for r in records],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiny", action="store_true", help="built-in tiny model on CPU (smoke test)")
    parser.add_argument("--jobs", type=int, default=8)
    parser.add_argument("--frames", type=int, default=25)
    parser.add_argument("--height", type=int, default=480)
    parser.add_argument("--width", type=int, default=720)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--layers", type=int, default=30, help="transformer layers (CogVideoX-2B has 30)")
    parser.add_argument("--pv", choices=("fp16", "fp8"), help="default: fp8 on CUDA, fp16 on CPU")
    parser.add_argument("--device", choices=("cuda", "cpu"), help="default: cpu with --tiny, else cuda")
    parser.add_argument("--model", type=Path, help="use this model folder (default: write one under --work)")
    parser.add_argument("--work", type=Path, help="folder for the model and outputs (default: a new temp dir)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    args.device = args.device or ("cpu" if args.tiny else "cuda")
    args.pv = args.pv or ("fp8" if args.device == "cuda" else "fp16")
    work = args.work or Path(tempfile.mkdtemp(prefix="bench_batch_"))
    # Offline, private, quiet Ray; workers inherit this environment and must find sagevideo.
    os.environ.update(HF_HUB_OFFLINE="1", HF_HUB_DISABLE_PROGRESS_BARS="1", RAY_USAGE_STATS_ENABLED="0",
                      RAY_AUTH_MODE="disabled")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))

    model = "tiny"
    if not args.tiny:
        folder = args.model or work / "model"
        if not (folder / "model_index.json").is_file():
            start = time.perf_counter()
            write_model(folder, args)
            say(f"model written to {folder} in {time.perf_counter() - start:.0f} s")
        model = str(folder)
    if args.device == "cuda":
        warm_triton(args)

    import ray

    start = time.perf_counter()
    ray.init(address="local", num_cpus=max(os.cpu_count() or 1, 2), include_dashboard=False,
             object_store_memory=256 * 2**20, logging_level="WARNING")  # jobs return records, not frames
    say(f"Ray started in {time.perf_counter() - start:.0f} s: {ray.cluster_resources()}")
    runs = []
    try:
        for n in (1, 2):
            runs.append(run(n, model, work / f"out-{n}w", args))
            say(f"{n} worker(s): {runs[-1]['done']}/{runs[-1]['jobs']} done in {runs[-1]['wall_s']:.1f} s")
    finally:
        ray.shutdown()
    one, two = runs
    report = {
        "model": "tiny" if args.tiny else f"CogVideoX-2B config, {args.layers} layers, random weights ({model})",
        "job": "model defaults" if args.tiny else f"{args.frames} frames {args.height}x{args.width}, "
               f"{args.steps} steps, CFG", "device": args.device, "pv": args.pv, "runs": runs,
        "ratio_wall": one["wall_s"] / two["wall_s"],
        "ratio_makespan": one["makespan_s"] / two["makespan_s"] if two["makespan_s"] else float("nan"),
        "ratio_steady": two["steady_jobs_per_min"] / one["steady_jobs_per_min"] if one["steady_jobs_per_min"]
        else float("nan"),
    }
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    print_table(report)
    return 0 if not (one["errors"] or two["errors"]) else 1


def print_table(report: dict) -> None:
    one, two = report["runs"]
    print(f"\nBatch throughput, {report['model']}; job: {report['job']}; {report['device']}, pv {report['pv']}")
    rows = [
        ("jobs done", f"{one['done']}/{one['jobs']}", f"{two['done']}/{two['jobs']}", ""),
        ("wall s (start+load+jobs)", f"{one['wall_s']:.1f}", f"{two['wall_s']:.1f}", f"{report['ratio_wall']:.2f}x"),
        ("jobs/min, wall", f"{one['jobs_per_min_wall']:.1f}", f"{two['jobs_per_min_wall']:.1f}", ""),
        ("jobs makespan s", f"{one['makespan_s']:.1f}", f"{two['makespan_s']:.1f}", f"{report['ratio_makespan']:.2f}x"),
        ("jobs/min, steady", f"{one['steady_jobs_per_min']:.1f}", f"{two['steady_jobs_per_min']:.1f}",
         f"{report['ratio_steady']:.2f}x"),
        ("mean job s", f"{one['mean_job_s']:.2f}", f"{two['mean_job_s']:.2f}", ""),
        ("model load s (slowest)", f"{one['max_load_s']:.1f}", f"{two['max_load_s']:.1f}", ""),
    ]
    print(f"{'':<26} {'1 worker':>10} {'2 workers':>10} {'ratio':>7}")
    for name, a, b, ratio in rows:
        print(f"{name:<26} {a:>10} {b:>10} {ratio:>7}")
    for run in report["runs"]:
        who = ", ".join(f"{k} ({w['jobs']} jobs, load {w['load_s']:.1f} s, job s {w['job_s']})"
                        for k, w in run["per_worker"].items())
        print(f"{run['workers']} worker(s): {who}; attention {run['attention']}"
              + (f"; SDPA FALLBACKS {run['fallbacks']}" if run["fallbacks"] else "")
              + (f"; FAILED {run['errors']}" if run["errors"] else ""))
    print("wall = the generate() call: Ray worker start + model load + jobs + driver commits (Ray's own start-up "
          "excluded); jobs makespan = the busiest worker's summed job times (denoise+decode+mp4 write), i.e. "
          "first job start to last job end without load; steady = sum over workers of jobs/min over those job "
          "times, without each worker's first (warm-up) job")
    print(f"target: 2 workers / 1 >= 1.95x: wall {report['ratio_wall']:.2f}x, makespan "
          f"{report['ratio_makespan']:.2f}x, steady {report['ratio_steady']:.2f}x"
          + ("  [tiny CPU run: not a measurement]" if report["device"] == "cpu" else ""))


if __name__ == "__main__":
    sys.exit(main())
