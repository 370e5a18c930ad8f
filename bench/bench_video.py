#!/usr/bin/env python
"""One whole video: stock diffusers against sagevideo's recipe, through the product (issue 21).

Writes a random-weight folder of --config (`bench.random_models`): CogVideoX-5B (the released
transformer and VAE configs, its scheduler settings, a 2-layer T5 of width 4096; 49 frames at
480x720, guidance 6) or Wan 2.1 14B text-to-video (the 14B transformer, Wan 2.1's VAE, UniPC with
720p's flow shift 5.0, a 2-layer umT5 of width 4096; 81 frames at 720x1280, guidance 5). Then makes
one video of --frames frames at --height x --width (the config's size by default), --steps steps,
CFG, decode included, in arms run one after another in this process:

- stock: `DiffusionPipeline.from_pretrained(folder)` as diffusers ships it (Wan's VAE in float32,
  as Wan's diffusers examples load it and sagevideo does), eager, SDPA with cuDNN first (the best
  16-bit attention on Hopper; flash, efficient after it: `sdpa_cudnn_first`);
- sage: `sagevideo.generate(..., recipe=--recipe)` on the same folder, --videos videos in one call:
  quantized attention plus the recipe (default regional compile + FP8 linears), timings from the
  manifest records: the first video (compilation lands in its first step) and the later ones;
- sage-cache: the same with `cache=first-block` (--cache-threshold): speed-up and steps skipped;
- sage-sparse: the same with `sparse=--sparse` (block-sparse attention, default dynamic:0.15; the
  first fifth of the steps and the first sparse layer dense, docs/sparse.md): what doing less
  attention work gives on a whole video (its quality is `ab`'s to judge, on a real model);
- sage-edges: the same with `linear_bf16_steps=0;-1` (the first and last step with bf16 weights,
  needs `linear=fp8` in --recipe): what the high-precision steps cost;
- second-worker: `sagevideo generate` in a new process with the sage recipe and 2 steps, after the
  sage arm filled the compile cache: a worker start with a warm cache, to the first step;
- stock-compiled: stock with each transformer block `torch.compile`d (what a user who already
  compiles runs);
- stock-noise-first (CogVideoX): stock with the scheduler sagevideo loads CogVideoX-5B with
  (`sagevideo.pipelines.cogvideox.noise_first`: the step noise drawn before the step waits for the
  device), attention as shipped: what that alone gives.

Video seconds are the pipeline call (text encoding, denoising, VAE decode and post-processing;
for sage, the record's denoise_s + decode_s); mp4 writing is not counted. first_step_s is from
the call's start to the end of step 1 (compilation lands there). steady_step_s =
(denoise - first step) / (steps - 1), denoise ending with the last step (stock: its step callback,
synchronized; the VAE decode after it is the arm's decode_s). The JSON is rewritten after each arm, so a run cut short
keeps what it measured.

    python -m bench.bench_video --json video.json [--arms sage,stock,second-worker,sage-cache]
    python -m bench.bench_video --json video.json --arms stock,sage,sage-sparse --sparse dynamic:0.15
    python -m bench.bench_video --config wan-14b --arms stock,sage-sparse --json wan.json   # tens of minutes
    python -m bench.bench_video --tiny [--config wan-14b]   # CPU smoke test (the family's built-in tiny model)
    python -m bench.bench_video --arms stock --steps 12 --profile-steps 4   # where a step's idle time goes

--profile-steps N (stock arms; no rows: the profiler slows the arm) wraps N steps in torch.profiler
and lists the device's idle gaps between kernels with the CPU ops that ran meanwhile (`bench.step_gap`).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if not __package__:  # run as a file: `bench` from the repo root, as with -m
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.results import add_results_option, start_run  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PROMPT = "a red panda climbing a tree in the rain, cinematic lighting"
ARMS = ("sage", "stock", "second-worker", "sage-cache", "sage-sparse", "sage-edges", "stock-compiled",
        "stock-noise-first")
DEFAULT_ARMS = "sage,stock,second-worker,sage-cache"
DEFAULT_RECIPE = "compile=regional,linear=fp8"
TINY_RECIPE = "compile=regional,compile_backend=eager"
# --config -> the guidance scale its model card uses (CFG: two transformer passes a step)
GUIDANCE = {"cogvideox-5b": 6.0, "wan-14b": 5.0}
# CogVideoX-5B's released VAE settings (diffusers' defaults otherwise).
VAE_5B = dict(scaling_factor=0.7)


def say(line: str) -> None:
    """A progress line, stamped with the wall clock (to line arms up with a GPU monitor's samples)."""
    print(f"bench_video: {time.strftime('%H:%M:%S')} {line}", file=sys.stderr, flush=True)


def write_model(folder: Path, args: argparse.Namespace) -> None:
    """The model folder both sides load: --config at the job's size, or the family's built-in tiny
    model (CogVideoX's with CogVideoX-5B's DPM scheduler, as the full-size folder)."""
    if args.config == "wan-14b" and args.tiny:
        from sagevideo.pipelines.wan.tiny import tiny_pipeline

        tiny_pipeline().save_pretrained(folder, safe_serialization=True)
        return
    if args.config == "wan-14b":
        from bench.random_models import write_wan_folder

        write_wan_folder(folder, {}, {}, device=args.device)  # the 14B's and Wan 2.1's VAE's configs
        return
    from diffusers import CogVideoXDPMScheduler

    from sagevideo.pipelines.forwards import COGVIDEOX_5B, COGVIDEOX_5B_SCHEDULER

    if args.tiny:
        from sagevideo.pipelines.cogvideox.tiny import tiny_pipeline

        pipe = tiny_pipeline()
        pipe.scheduler = CogVideoXDPMScheduler(**COGVIDEOX_5B_SCHEDULER)
        pipe.save_pretrained(folder, safe_serialization=True)
        return
    from bench.random_models import write_cogvideox_folder


    cfg = dict(COGVIDEOX_5B, sample_frames=args.frames, sample_height=args.height // 8, sample_width=args.width // 8)
    vae = dict(VAE_5B, sample_height=args.height, sample_width=args.width)
    scheduler = CogVideoXDPMScheduler(**COGVIDEOX_5B_SCHEDULER)
    write_cogvideox_folder(folder, cfg, vae, device=args.device, scheduler=scheduler)


def stock_arm(folder: Path, args: argparse.Namespace, *, compiled: bool = False, noise_first: bool = False) -> dict:
    """diffusers' pipeline as shipped (SDPA cuDNN first on CUDA); with compiled, each block compiled;
    with noise_first, sagevideo's `NoiseFirstDPMScheduler` in place of its scheduler."""
    import torch
    from diffusers import DiffusionPipeline

    from sagevideo.experiments.bench.forward import sdpa_cudnn_first
    from sagevideo.experiments.bench.timing import synchronizer
    from sagevideo.pipelines.recipe import transformer_blocks

    start = time.perf_counter()
    parts = {}
    if args.config == "wan-14b":
        from diffusers import AutoencoderKLWan

        parts["vae"] = AutoencoderKLWan.from_pretrained(folder, subfolder="vae", torch_dtype=torch.float32)
    pipe = DiffusionPipeline.from_pretrained(folder, dtype=args.dtype, **parts).to(args.device)
    pipe.set_progress_bar_config(disable=True)
    if compiled:
        for _, block in transformer_blocks(pipe.transformer):
            block.compile(backend=args.compile_backend)
    if noise_first:
        from sagevideo.pipelines.cogvideox.noise_first import use_noise_first

        if not use_noise_first(pipe):
            raise SystemExit(f"bench_video: {type(pipe.scheduler).__name__} was not swapped (see the warning)")
    load_s = time.perf_counter() - start
    step_ends: list[float] = []  # the ends of the first and the last step (synchronized there only)
    sync = synchronizer(args.device)
    profiler = None
    if args.profile_steps:
        from bench.step_gap import StepProfiler

        profiler = StepProfiler(profile_start(args.steps), args.profile_steps, sync, cuda=args.device == "cuda")

    def on_step(_pipe, step, _timestep, tensors):
        if step in (0, args.steps - 1):
            sync()
            step_ends.append(time.perf_counter())
        if profiler is not None:
            profiler.on_step(step)
        return tensors

    with sdpa_cudnn_first(args.device), torch.no_grad():
        sync()
        start = time.perf_counter()
        frames = pipe(PROMPT, num_frames=args.frames, height=args.height, width=args.width,
                      num_inference_steps=args.steps, guidance_scale=GUIDANCE[args.config],
                      generator=torch.Generator("cpu").manual_seed(0), output_type="np",
                      callback_on_step_end=on_step).frames
        sync()
        video_s = time.perf_counter() - start
    finite = bool(torch.isfinite(torch.as_tensor(frames)).all())
    first_step_s, denoise_s = step_ends[0] - start, step_ends[-1] - start
    scheduler, pipeline = type(pipe.scheduler).__name__, type(pipe).__name__
    del pipe
    torch.cuda.empty_cache() if torch.cuda.is_available() else None
    return {"pipeline": pipeline, "load_s": load_s, "video_s": video_s, "first_step_s": first_step_s,
            "decode_s": video_s - denoise_s,
            "steady_step_s": _steady(denoise_s, first_step_s, args.steps), "frames_finite": finite,
            "attention": "SDPA (cuDNN first)" if args.device == "cuda" else "SDPA",
            "scheduler": scheduler,
            # with --profile-steps the arm's timings include the profiler's own cost: a diagnosis, not a figure
            **({"step_gap": profiler.report, "profiled": True} if profiler is not None else {})}


def profile_start(steps: int) -> int:
    """The first step --profile-steps profiles: a fifth of the way in, past the first steps."""
    return max(1, steps // 5)


def _steady(denoise_s: float, first_step_s: float, steps: int) -> float | None:
    return (denoise_s - first_step_s) / (steps - 1) if steps > 1 else None


def sage_arm(folder: Path, out: Path, args: argparse.Namespace, recipe: str, sparse: str | None = None) -> dict:
    """--videos videos (seeds 0, 1, ...) in one `sagevideo.generate` call with `recipe` (and the
    block-sparse setting `sparse`, e.g. "dynamic:0.15"), from the
    manifest records' timings: the first video (it pays compilation in step 1) and, with more than
    one, the later ones (`later_video_s`, their mean: what each further video of a batch costs)."""
    import sagevideo

    jobs = [{"prompt": PROMPT, "seed": seed} for seed in range(args.videos)]
    start = time.perf_counter()
    records = sagevideo.generate(jobs, model=str(folder), out=out, frames=args.frames, height=args.height,
                                 width=args.width, steps=args.steps, guidance=GUIDANCE[args.config],
                                 device=args.device,
                                 recipe=recipe, progress=False, **({"sparse": sparse} if sparse else {}))
    wall = time.perf_counter() - start
    failed = [r for r in records if r["status"] != "done"]
    if failed:
        raise SystemExit(f"bench_video: the sagevideo arm failed: {failed[0]['error']}")
    first, *later = records
    t = first["timings"]
    found = {"load_s": t["load_s"], "recipe_s": t.get("recipe_s"), "video_s": t["denoise_s"] + t["decode_s"],
             "first_step_s": t["first_step_s"], "steady_step_s": _steady(t["denoise_s"], t["first_step_s"], args.steps),
             "wall_s": wall, "backends": first["backends"], "recipe": first.get("recipe"), "timings": t,
             "scheduler": first.get("scheduler")}
    if later:
        found["later_video_s"] = sum(r["timings"]["denoise_s"] + r["timings"]["decode_s"] for r in later) / len(later)
        found["later_first_step_s"] = sum(r["timings"]["first_step_s"] for r in later) / len(later)
        found["later_records"] = [{"timings": r["timings"], "recipe": r.get("recipe")} for r in later]
    return found


def second_worker_arm(folder: Path, out: Path, args: argparse.Namespace, recipe: str) -> dict:
    """`sagevideo generate` in a fresh process (same compile cache), 2 steps: start-up to step 1."""
    from sagevideo.jobs.recipe import parse_recipe

    flags: list[str] = []
    for name, value in parse_recipe(recipe).model_dump(exclude_defaults=True).items():
        for item in value if isinstance(value, list) else [value]:
            flags += [f"--{name.replace('_', '-')}", str(item)]
    command = [sys.executable, "-m", "sagevideo", "generate", "--prompt", PROMPT, "--model", str(folder),
               "--out", str(out), "--frames", str(args.frames), "--height", str(args.height), "--width",
               str(args.width), "--steps", "2", "--guidance", str(GUIDANCE[args.config]), "--device", args.device,
               "--no-progress", *flags]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    start = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"bench_video: second worker failed ({done.returncode}): {done.stderr[-2000:]}")
    (record,) = [json.loads(line) for line in (out / "manifest.jsonl").read_text().splitlines() if line.strip()]
    t = record["timings"]
    after_first = t["denoise_s"] - t["first_step_s"] + t["decode_s"] + (t["write_s"] or 0.0)
    return {"wall_s": wall, "load_s": t["load_s"], "first_step_s": t["first_step_s"],
            # process start -> end of step 1, as the worker recorded it; the bound (the wall less
            # what came after step 1: its second step, decode, mp4 write, and the process's exit)
            # beside it, and in its place for records without it
            "to_first_step_s": t.get("process_to_first_step_s", wall - after_first),
            "to_first_step_bound_s": wall - after_first, "to_load_s": t.get("process_to_load_s"),
            "recipe_s": t.get("recipe_s"), "timings": t, "backends": record["backends"],
            "recipe": record.get("recipe")}


def ratios(arms: dict) -> dict:
    """Stock / sage ratios of what both arms measured."""
    found = {}
    stock = arms.get("stock")
    for name in ("sage", "sage-cache", "sage-sparse", "sage-edges", "stock-compiled", "stock-noise-first"):
        arm = arms.get(name)
        if stock is None or arm is None:
            continue
        found[f"{name}_x_stock_video"] = stock["video_s"] / arm["video_s"]
        if arm.get("later_video_s"):
            found[f"{name}_x_stock_later_video"] = stock["video_s"] / arm["later_video_s"]
        if stock.get("steady_step_s") and arm.get("steady_step_s"):
            found[f"{name}_x_stock_steady_step"] = stock["steady_step_s"] / arm["steady_step_s"]
    if "stock-compiled" in arms and "sage" in arms:
        found["sage_x_stock_compiled_video"] = arms["stock-compiled"]["video_s"] / arms["sage"]["video_s"]
    return found


def table(report: dict) -> list[str]:
    lines = [f"{'arm':15s} {'video s':>8s} {'first step s':>13s} {'steady step s':>14s} {'load s':>7s}  notes"]
    for name, arm in report["arms"].items():
        if name == "second-worker":
            lines.append(f"{name:15s} {'':>8s} {arm['first_step_s']:13.1f} {'':>14s} {arm['load_s']:7.1f}  "
                         f"process start to step 1: {arm['to_first_step_s']:.1f} s (warm compile cache; "
                         f"before the load {arm.get('to_load_s') or 0:.1f} s, recipe {arm.get('recipe_s') or 0:.1f} s; "
                         f"wall less what followed step 1: {arm['to_first_step_bound_s']:.1f} s)")
            continue
        steady = f"{arm['steady_step_s']:.3f}" if arm.get("steady_step_s") else "-"
        counts = (arm.get("backends") or {}).get("counts", {})
        note = arm.get("attention") or ", ".join(f"{k} x{v}" for k, v in counts.items())
        recipe = arm.get("recipe") or {}
        if recipe.get("cache") not in (None, "none"):
            note += f"; cache skipped {recipe.get('cache_skipped')} of {recipe.get('cache_forwards')} forwards"
        if arm.get("later_video_s"):
            note += f"; later videos {arm['later_video_s']:.1f} s (first step {arm['later_first_step_s']:.1f} s)"
        if arm.get("recipe_s"):
            note += f"; recipe applied in {arm['recipe_s']:.1f} s"
        note += _sparse_note((arm.get("backends") or {}).get("sparse"))
        lines.append(f"{name:15s} {arm['video_s']:8.1f} {arm['first_step_s']:13.1f} {steady:>14s} "
                     f"{arm['load_s']:7.1f}  {note}")
    lines += [f"{k}: {v:.2f}x" for k, v in report["ratios"].items()]
    for name, arm in report["arms"].items():
        if arm.get("step_gap"):
            from bench.step_gap import gap_lines

            head, *gaps = gap_lines(arm["step_gap"])
            lines += [f"{name} (profiled, timings include the profiler): {head}", *gaps]
    return lines


def _sparse_note(sparse: dict | None) -> str:
    """The block-sparse arm's mean density per step (1.0: dense), from the manifest's backends.sparse."""
    if not sparse:
        return ""
    steps = sparse.get("steps") or {}
    return "; sparse density per step " + " ".join(f"{value:.2f}" for value in steps.values()) if steps else ""


def result_rows(run, shape: str, report: dict):
    """Rows per arm: video_s, first_step_s, steady_step_s (and the ratios to stock)."""
    for name, arm in report["arms"].items():
        extra = {k: arm[k] for k in ("backends", "recipe", "attention") if arm.get(k)}
        for metric in ("video_s", "later_video_s", "first_step_s", "steady_step_s", "to_first_step_s", "load_s",
                       "recipe_s", "to_load_s"):
            if arm.get(metric) is not None:
                run.add(shape, name, metric, arm[metric], unit="s", **extra)
    for key, value in report["ratios"].items():
        arm, _, metric = key.partition("_x_")
        run.add(shape, arm, f"x_{metric}", value)
    return run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", choices=sorted(GUIDANCE), default="cogvideox-5b",
                        help="the model whose random-weight folder is written (or the family of --model's folder)")
    parser.add_argument("--tiny", action="store_true", help="the family's built-in tiny model on CPU (smoke test)")
    parser.add_argument("--arms", default=DEFAULT_ARMS, help=f"comma-separated, in order, of {', '.join(ARMS)}")
    parser.add_argument("--recipe", help=f"sage arm's recipe (default {DEFAULT_RECIPE}; --tiny: {TINY_RECIPE})")
    parser.add_argument("--cache-threshold", type=float, default=0.05, help="sage-cache arm's first-block threshold")
    parser.add_argument("--sparse", default="dynamic:0.15", help="sage-sparse arm's block-sparse setting (METHOD:D)")
    parser.add_argument("--videos", type=int, default=2,
                        help="videos per sage arm in one generate call (the first pays compilation; the later "
                             "ones are what a batch's further videos cost)")
    parser.add_argument("--profile-steps", type=int, default=0,
                        help="stock arms: torch.profiler over this many steps, the device's idle gaps and the CPU "
                             "ops in them (a diagnosis: the arm's timings then include the profiler)")
    parser.add_argument("--frames", type=int, help="default: the config's (49 for CogVideoX-5B, 81 for Wan; --tiny: 9)")
    parser.add_argument("--height", type=int, help="default: the config's (480; Wan 14B 720; --tiny: 64)")
    parser.add_argument("--width", type=int, help="default: the config's (720; Wan 14B 1280; --tiny: 64)")
    parser.add_argument("--steps", type=int, help="default 50 (--tiny: 3)")
    parser.add_argument("--model", type=Path, help="use this model folder (default: write one under --work)")
    parser.add_argument("--work", type=Path, help="folder for the model and outputs (default: a new temp dir)")
    parser.add_argument("--json", type=Path)
    add_results_option(parser)
    args = parser.parse_args(argv)
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    unknown = [a for a in arms if a not in ARMS]
    if unknown:
        parser.error(f"--arms: {unknown[0]!r} is not one of {', '.join(ARMS)}")
    if "stock-noise-first" in arms and args.config != "cogvideox-5b":
        parser.error("--arms stock-noise-first: that scheduler is CogVideoX's; --config wan-14b has none")
    from sagevideo.pipelines.forwards import CONFIGS

    if args.model is not None and (args.model / "model_index.json").is_file():
        from sagevideo.pipelines.loading import resolve_model

        family = resolve_model(str(args.model)).family
        if family != CONFIGS[args.config][0]:  # else the other family's guidance, size and stock loading
            fitting = " or ".join(c for c in sorted(GUIDANCE) if CONFIGS[c][0] == family)
            parser.error(f"--model {args.model} is a {family} folder; "
                         + (f"give --config {fitting}" if fitting else f"--config takes {', '.join(sorted(GUIDANCE))}"))
    frames, height, width, steps = (9, 64, 64, 3) if args.tiny else (*CONFIGS[args.config][1:], 50)
    args.frames, args.height, args.width = args.frames or frames, args.height or height, args.width or width
    args.steps = args.steps or steps

    if args.profile_steps and args.append_results:
        parser.error("--profile-steps is a diagnosis (the profiler slows the arm): no --append-results with it")
    if args.profile_steps and profile_start(args.steps) + args.profile_steps > args.steps:
        parser.error(f"--profile-steps {args.profile_steps}: {args.steps} steps leave "
                     f"{args.steps - profile_start(args.steps)} after step {profile_start(args.steps)}; "
                     "give fewer or more --steps")
    import torch

    args.device = "cuda" if torch.cuda.is_available() and not args.tiny else "cpu"
    args.dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    args.compile_backend = "inductor" if args.device == "cuda" else "eager"
    recipe = args.recipe or (TINY_RECIPE if args.tiny else DEFAULT_RECIPE)
    if "sage-edges" in arms:
        from sagevideo.jobs.recipe import parse_recipe

        if parse_recipe(recipe).linear != "fp8":
            parser.error(f"--arms sage-edges: runs steps in bf16 beside FP8 linears; --recipe {recipe!r} has none")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    work = args.work or Path(tempfile.mkdtemp(prefix="bench_video_"))
    folder = args.model or work / "model"
    if not (folder / "model_index.json").is_file():
        start = time.perf_counter()
        write_model(folder, args)
        say(f"model written to {folder} in {time.perf_counter() - start:.0f} s")
    gpu = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    size = f"{args.frames}f-{args.height}x{args.width}-{args.steps}steps"
    family = args.config.split("-")[0]
    shape = f"{family}-tiny" if args.tiny else f"{args.config}-{size}"
    report: dict = {"model": f"tiny-{family}" if args.tiny else f"{args.config} config, random weights", "shape": shape,
                    "gpu": gpu, "recipe": recipe, "cache_threshold": args.cache_threshold, "arms": {}, "ratios": {}}
    for name in arms:
        say(f"{name} ...")
        # A new output folder per arm and run: in one that holds an earlier run's videos, generate
        # would skip the done jobs and the arm would report that run's timings as this one's.
        out = Path(tempfile.mkdtemp(dir=work, prefix=f"out-{name}-"))
        if name in ("stock", "stock-compiled", "stock-noise-first"):
            result = stock_arm(folder, args, compiled=name == "stock-compiled", noise_first=name == "stock-noise-first")
        elif name == "sage":
            result = sage_arm(folder, out, args, recipe)
        elif name == "sage-cache":
            cached = f"{recipe},cache=first-block,cache_threshold={args.cache_threshold}"
            result = sage_arm(folder, out, args, cached)
        elif name == "sage-sparse":
            result = sage_arm(folder, out, args, recipe, sparse=args.sparse)
        elif name == "sage-edges":
            result = sage_arm(folder, out, args, f"{recipe},linear_bf16_steps=0;-1")
        else:
            result = second_worker_arm(folder, out, args, recipe)
        report["arms"][name] = result
        report["ratios"] = ratios(report["arms"])
        say(f"{name}: " + ", ".join(f"{k} {v:.2f}" for k, v in result.items() if isinstance(v, float)))
        if args.json:
            args.json.write_text(json.dumps(report, indent=2, default=str))
    if args.append_results:
        added = result_rows(start_run("bench_video", gpu, argv), shape, report).append(args.append_results)
        print(f"bench_video: {added} rows appended to {args.append_results}")
    print(f"{shape} on {gpu}; sage recipe {recipe}:")
    for line in table(report):
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
