"""The `sagevideo` command line: a thin typer layer over the Python API.

Each command parses its options, calls the API, and maps errors to exit codes:
0 success, 1 a job or the model load failed, 2 bad input (reported before any model loads).
Heavy modules (torch, diffusers) are imported inside the commands so `--help` stays instant.
"""

from __future__ import annotations

import sys
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(
    name="sagevideo",
    help="Fast long-sequence video diffusion with SageAttention-style quantized attention.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
)

EXIT_FAILED = 1
EXIT_BAD_INPUT = 2


@app.callback()
def main() -> None:
    """Fast long-sequence video diffusion with SageAttention-style quantized attention."""


def fail(command: str, message: str, code: int) -> typer.Exit:
    """Print 'sagevideo <command>: error: ...' to stderr; return the Exit to raise."""
    lines = message.splitlines() or [""]
    for line in lines:
        typer.echo(f"sagevideo {command}: error: {line}", err=True)
    return typer.Exit(code)


class Attention(str, Enum):
    sage = "sage"
    full = "full"


class Backend(str, Enum):
    auto = "auto"
    triton = "triton"
    reference = "reference"
    sdpa = "sdpa"


class PV(str, Enum):
    auto = "auto"
    fp16 = "fp16"
    fp8 = "fp8"


class Device(str, Enum):
    auto = "auto"
    cpu = "cpu"
    cuda = "cuda"


EXIT_INTERRUPTED = 130  # as a shell reports a command stopped by Ctrl-C (128 + SIGINT)


@app.command()
def generate(
    job_file: Annotated[
        Path | None,
        typer.Argument(
            help="Job file: .yaml/.yml or .toml (defaults: and jobs: with per-job prompt, negative_prompt, "
            "seed, frames, resolution, steps, guidance, attention, pv, plan, output, frames_png), or any other file "
            "as plain text, one prompt per line (blank lines and # comments are skipped).",
            show_default=False,
        ),
    ] = None,
    out: Annotated[
        Path, typer.Option("--out", "-o", help="Output folder for the mp4 files and manifest.jsonl.")
    ] = ...,
    model: Annotated[
        str, typer.Option(help="'tiny' (built in, no download) or a local diffusers folder.")
    ] = "tiny",
    prompt: Annotated[
        list[str] | None,
        typer.Option(
            "--prompt", "-p", help="A prompt (repeatable). Without prompts: a built-in batch of two."
        ),
    ] = None,
    negative_prompt: Annotated[str, typer.Option(help="Negative prompt for every job.")] = "",
    seed: Annotated[
        int, typer.Option(help="Seed of the initial noise (CPU generator: same on every device).")
    ] = 0,
    frames: Annotated[
        int | None, typer.Option(help="Frames, 1 + 8k (default: the model's; tiny: 9).")
    ] = None,
    height: Annotated[
        int | None, typer.Option(help="Height in px, multiple of 16 (default: the model's; tiny: 64).")
    ] = None,
    width: Annotated[
        int | None, typer.Option(help="Width in px, multiple of 16 (default: the model's; tiny: 64).")
    ] = None,
    steps: Annotated[
        int | None, typer.Option(help="Denoising steps (default: tiny 2, local models 50).")
    ] = None,
    guidance: Annotated[float, typer.Option(help="Classifier-free guidance scale (<= 1 disables it).")] = 6.0,
    attention: Annotated[
        Attention, typer.Option(help="sage: quantized attention; full: stock full precision.")
    ] = Attention.sage,
    backend: Annotated[
        Backend,
        typer.Option(help="sageattn backend; auto = Triton on CUDA, the emulation (reference) on CPU."),
    ] = Backend.auto,
    pv: Annotated[
        PV,
        typer.Option(help="Precision of the P·V product; auto = FP8 on GPUs with FP8 tensor cores (sm89+), else FP16."),
    ] = PV.auto,
    plan: Annotated[
        Path | None,
        typer.Option(help="Attention-plan JSON for jobs that name none (checked, recorded in the manifest)."),
    ] = None,
    device: Annotated[Device, typer.Option(help="auto = CUDA when available, else CPU.")] = Device.auto,
    fps: Annotated[int, typer.Option(help="Frame rate of the mp4 files.")] = 8,
    address: Annotated[
        str | None,
        typer.Option(
            help="Run on Ray: 'auto' (this machine's cluster, else a local instance) or the head's HOST:PORT. "
            "Without it, Ray is used only for --workers > 1 or several visible GPUs."
        ),
    ] = None,
    workers: Annotated[
        int | None,
        typer.Option(help="Ray workers, each loading the model once (default: one per GPU; 1 = this process)."),
    ] = None,
    gpus_per_job: Annotated[
        int,
        typer.Option(
            help="Split each job over N GPUs of one node (Ulysses sequence parallelism, CogVideoX; Ray "
            "groups of N ranks, --workers counts groups). With --device cpu: N CPU processes (gloo).",
        ),
    ] = 1,
    max_attempts: Annotated[
        int, typer.Option(help="Runs of a job whose worker died (killed, CUDA error, OOM) before it fails.")
    ] = 3,
    job_timeout: Annotated[
        float | None,
        typer.Option(
            help="Seconds one job may run. On Ray a job still running then has its worker stopped and is "
            "retried (a hang); in this process it is stopped mid-step (between two torch operations) and fails.",
        ),
    ] = None,
    frames_png: Annotated[
        bool,
        typer.Option(
            "--frames-png/--no-frames-png",
            help="Also write each job's frames as PNGs into <output>_frames/ (job files: frames_png).",
        ),
    ] = False,
    progress: Annotated[bool, typer.Option("--progress/--no-progress", help="Show the progress bar.")] = True,
) -> None:
    """Generate videos into --out; re-running resumes (finished jobs are skipped, failed ones redone).

    Job-file values win over these options: job > the file's defaults > option.

    Exit codes: 0 all done, 1 a job or the model load failed (or a full disk stopped the batch), 2 bad input
    or --out in use by another run (nothing loaded), 130 Ctrl-C, 143 SIGTERM (finished videos kept).
    """
    from tqdm.auto import tqdm

    from sagevideo.generation.generate import BatchInterrupted, ModelLoadError, plan_batch, run_batch
    from sagevideo.jobs.specs import InputError

    try:
        batch = plan_batch(
            prompt or None,
            job_file=job_file,
            out=out,
            model=model,
            seed=seed,
            frames=frames,
            height=height,
            width=width,
            steps=steps,
            guidance=guidance,
            negative_prompt=negative_prompt,
            attention=attention.value,
            pv=pv.value,
            plan=plan,
            backend=backend.value,
            device=device.value,
            fps=fps,
            address=address,
            workers=workers,
            max_attempts=max_attempts,
            gpus_per_job=gpus_per_job,
            job_timeout=job_timeout,
            frames_png=frames_png,
        )
    except InputError as err:
        raise fail("generate", str(err), EXIT_BAD_INPUT) from None
    for note in batch.notes:
        typer.echo(f"sagevideo: {note}", err=True)
    try:
        report = run_batch(batch, progress=progress, echo=lambda line: tqdm.write(line, file=sys.stderr))
    except InputError as err:  # e.g. --address that no cluster answers: nothing was loaded
        raise fail("generate", str(err), EXIT_BAD_INPUT) from None
    except ModelLoadError as err:
        raise fail("generate", str(err), EXIT_FAILED) from None
    except BatchInterrupted as stop:
        typer.echo(stop.report.summary_line())
        raise typer.Exit(stop.exit_code) from None
    typer.echo(report.summary_line())
    if not report.ok:
        raise typer.Exit(EXIT_FAILED)


@app.command()
def env() -> None:
    """Print torch/triton/GPU versions and which kernel plan runs on each device, and why."""
    from sagevideo.cli.env_report import report_lines

    try:
        lines = report_lines()
    except ValueError as err:  # a misspelt SAGEVIDEO_SM90_KERNEL
        raise fail("env", str(err), EXIT_BAD_INPUT) from None
    for line in lines:
        typer.echo(line)


class SimPV(str, Enum):
    fp16 = "fp16"
    fp8 = "fp8"
    fp32 = "fp32"
    int8_naive = "int8-naive"


class OnOff(str, Enum):
    on = "on"
    off = "off"
    both = "both"


class Granularity(str, Enum):
    block = "block"
    token = "token"


class Preset(str, Enum):
    random = "random"
    k_offset = "k-offset"
    q_outlier = "q-outlier"
    peaky = "peaky"
    near_uniform = "near-uniform"
    padded = "padded"
    large = "large"


def _settings(value: OnOff) -> list[bool]:
    return {"on": [True], "off": [False], "both": [False, True]}[value.value]


def _shape(text: str) -> tuple[int, int, int, int]:
    try:
        dims = tuple(int(x) for x in text.split(","))
    except ValueError:
        dims = ()
    if len(dims) != 4 or min(dims) < 1:
        raise typer.BadParameter(f"{text!r}: give B,H,N,D as four positive integers, e.g. 1,8,1024,128")
    return dims  # type: ignore[return-value]


@app.command()
def simulate(
    preset: Annotated[Preset, typer.Option(help="Synthetic inputs (ignored with --qkv).")] = Preset.k_offset,
    qkv: Annotated[
        Path | None,
        typer.Option(help="safetensors file of captured q/k/v (or <layer>.q/.k/.v), (B, H, N, D)."),
    ] = None,
    layout: Annotated[str, typer.Option(help="Layout of the --qkv tensors: HND or NHD.")] = "HND",
    shape: Annotated[str, typer.Option(help="B,H,N,D of the synthetic inputs.")] = "1,8,1024,128",
    seed: Annotated[int, typer.Option(help="Seed of the synthetic inputs.")] = 0,
    pv: Annotated[
        list[SimPV] | None,
        typer.Option(help="PV precision(s) to compare (repeatable); int8-naive is the seed's naive INT8 PV."),
    ] = None,
    smooth_k: Annotated[OnOff, typer.Option(help="Subtract the mean of K: on, off or both.")] = OnOff.both,
    rotate: Annotated[OnOff, typer.Option(help="Hadamard-rotate Q and K: on, off or both.")] = OnOff.on,
    qk_bits: Annotated[int, typer.Option(min=2, max=16, help="Bits of the Q/K integer quantization.")] = 8,
    granularity: Annotated[Granularity, typer.Option(help="Q/K scale per tile or per token.")] = Granularity.block,
    block_m: Annotated[int | None, typer.Option(min=1, help="Q tile (default: the kernel plan's).")] = None,
    block_n: Annotated[int | None, typer.Option(min=1, help="K tile (default: the kernel plan's).")] = None,
    dtype: Annotated[str, typer.Option(help="Input dtype before quantization: fp16, bf16 or fp32.")] = "fp32",
    json_out: Annotated[Path | None, typer.Option("--json", help="Also write the figures as JSON.")] = None,
) -> None:
    """Simulate quantized attention against exact fp64 attention: cosine, rel-L1, RMSE, worst first.

    Exit codes: 0 done, 2 bad input (checked before computing, including whether it fits in memory)."""
    import json

    from sagevideo.eval.numerics.simulate import estimate_bytes, format_table, qkv_file_shapes, variant_grid
    from sagevideo.eval.numerics.simulate import simulate as run_simulation
    from sagevideo.generation.budget import available_bytes, format_bytes
    from sagevideo.outputs.files import writable_file

    dims = _shape(shape)
    if qkv is not None and not qkv.is_file():
        raise fail("simulate", f"--qkv {qkv}: no such file", EXIT_BAD_INPUT)
    if dtype not in ("fp16", "bf16", "fp32"):
        raise fail("simulate", f"--dtype {dtype}: use fp16, bf16 or fp32", EXIT_BAD_INPUT)
    if layout not in ("HND", "NHD"):
        raise fail("simulate", f"--layout {layout}: use HND or NHD", EXIT_BAD_INPUT)
    try:  # everything that could fail after the computation is checked before it
        if json_out is not None:
            writable_file(json_out, "--json", ValueError, "figures.json")
    except ValueError as err:
        raise fail("simulate", str(err), EXIT_BAD_INPUT) from None
    try:
        shapes = qkv_file_shapes(qkv, layout) if qkv is not None else {preset.value: dims}
    except ValueError as err:  # the message starts with the file's path
        raise fail("simulate", f"--qkv {err}", EXIT_BAD_INPUT) from None
    modes = [p.value for p in (pv or [SimPV.fp16, SimPV.fp8])]
    variants = variant_grid(
        modes, _settings(smooth_k), _settings(rotate),
        qk_bits=qk_bits, granularity=granularity.value, block_m=block_m, block_n=block_n,
    )
    need, have = estimate_bytes(shapes.values(), variants, dtype), available_bytes("cpu") or 0
    if have and need > have:
        b, h, n, d = max(shapes.values(), key=lambda x: x[0] * x[1] * x[2] ** 2)
        fits = max(128, int((have / 2 / (16 * b * h)) ** 0.5) // 128 * 128)
        raise fail(
            "simulate",
            f"needs about {format_bytes(need)} of memory (the exact fp64 reference holds B·H·N² = {b}·{h}·{n}² "
            f"scores), this machine has {format_bytes(have)} available; use fewer tokens or heads, e.g. "
            f"--shape {b},{h},{min(fits, n)},{d}" + (" (or a --qkv file with shorter sequences)" if qkv else ""),
            EXIT_BAD_INPUT,
        )
    from tqdm.auto import tqdm

    bar = tqdm(total=len(shapes) * (len(variants) + 1), desc="simulate", unit="run", file=sys.stderr,
               dynamic_ncols=True, leave=False)

    started = []

    def step(text: str) -> None:  # called before each run: the bar counts the finished ones
        bar.update(1 if started else 0)
        started.append(text)
        bar.set_postfix_str(text[:60], refresh=True)

    try:
        results = run_simulation(
            variants, preset=preset.value, shape=dims, seed=seed,
            qkv_file=None if qkv is None else str(qkv), layout=layout, dtype=dtype, progress=step,
        )
    except (ValueError, FileNotFoundError) as err:
        raise fail("simulate", str(err), EXIT_BAD_INPUT) from None
    finally:
        bar.close()
    source = str(qkv) if qkv else f"preset {preset.value} {dims} seed {seed}"
    typer.echo(f"inputs: {source}, dtype {dtype}; errors vs fp64 attention, per (batch, head)\n")
    typer.echo(format_table(results))
    if json_out is not None:
        json_out.write_text(json.dumps([r.summary() for r in results], indent=2))
    worst = min(results, key=lambda r: r.summary()["cos_worst"]).summary()
    typer.echo(f"\nsagevideo simulate: {len(results)} variants; worst cosine {worst['cos_worst']:.5f} "
               f"({worst['variant']}, {worst['worst_layer']} {worst['worst_head']})"
               + (f"; figures in {json_out}" if json_out else ""))


@app.command()
def calibrate(
    prompts_file: Annotated[
        Path | None, typer.Argument(help="Text file with one prompt per line.", show_default=False)
    ] = None,
    out: Annotated[Path, typer.Option("--out", "-o", help="Where to write the plan (JSON).")] = ...,
    model: Annotated[str, typer.Option(help="'tiny' or a local diffusers folder.")] = "tiny",
    prompt: Annotated[list[str] | None, typer.Option("--prompt", "-p", help="A prompt (repeatable).")] = None,
    steps: Annotated[int | None, typer.Option(help="Denoising steps (default: the model's).")] = None,
    capture_steps: Annotated[
        str | None, typer.Option(help="Steps to measure, e.g. '0,1,-1' (default: all).")
    ] = None,
    threshold: Annotated[float, typer.Option(help="Worst cosine a quantized mode must reach per layer.")] = 0.999,
    frames: Annotated[int | None, typer.Option(help="Frames (default: the model's).")] = None,
    height: Annotated[int | None, typer.Option(help="Height in px (default: the model's).")] = None,
    width: Annotated[int | None, typer.Option(help="Width in px (default: the model's).")] = None,
    seed: Annotated[int, typer.Option(help="Seed of the initial noise.")] = 0,
    device: Annotated[Device, typer.Option(help="auto = CUDA when available, else CPU.")] = Device.auto,
    save_qkv: Annotated[
        Path | None, typer.Option(help="Also save captured Q/K/V (safetensors) for `sagevideo simulate --qkv`.")
    ] = None,
    progress: Annotated[bool, typer.Option("--progress/--no-progress", help="Show the progress bar.")] = True,
) -> None:
    """Measure each attention layer's error per mode on real prompts and write the fastest plan that
    meets the threshold (full precision where no mode does).

    Exit codes: 0 done, 2 bad input (nothing was loaded)."""
    from sagevideo.experiments.calibrate import calibrate as run_calibration
    from sagevideo.jobs.specs import InputError, read_prompts_file

    prompts = list(prompt or [])
    try:
        if prompts_file is not None:  # UTF-8 text with at least one prompt, else one line saying so
            prompts += [text for text, _ in read_prompts_file(prompts_file)]
        try:
            steps_list = None if capture_steps is None else [int(s) for s in capture_steps.split(",") if s.strip()]
        except ValueError:
            raise InputError(f"--capture-steps {capture_steps!r}: give integers like 0,1,-1") from None
        result = run_calibration(
            prompts if prompt or prompts_file else None, out=out, model=model, steps=steps, frames=frames,
            height=height, width=width, seed=seed, capture_steps=steps_list, threshold=threshold,
            device=device.value, save_qkv=save_qkv, progress=progress,
        )
    except InputError as err:
        raise fail("calibrate", str(err), EXIT_BAD_INPUT) from None
    from sagevideo.pipelines.calibrate import CANDIDATES

    typer.echo(result.table())
    name, worst = result.worst_layer()
    overrides = len(result.plan.overrides)
    typer.echo(
        f"\nsagevideo calibrate: {len(result.errors)} layers -> {out} (default {result.plan.default.label}, "
        f"{overrides} override{'s' if overrides != 1 else ''}); worst layer {name}: cosine {worst.cos:.5f} "
        f"with {CANDIDATES[0].label} at step {worst.step}" + (f"; Q/K/V in {save_qkv}" if save_qkv else "")
    )
    if result.peaky_note():
        typer.echo(f"sagevideo calibrate: {result.peaky_note()}")


# --- evaluation: `sagevideo eval`, `sagevideo ab`, `sagevideo check-weights` (sagevideo.eval) ---


class LpipsNet(str, Enum):
    alex = "alex"
    vgg = "vgg"


_EVAL_EXIT_INTERRUPTED = 130


def _eval_options(metrics, weights, device, lpips_net, resamples, set_resamples, diff_gain):
    """EvalOptions from the shared eval/ab options (torch is imported only here)."""
    import torch

    from sagevideo.eval.evaluate import EvalOptions
    from sagevideo.eval.stats import Bootstrap

    dev = device.value
    if dev == "auto":
        dev = "cuda" if torch.cuda.is_available() else "cpu"
    return EvalOptions(
        metrics=metrics or None, weights=weights, device=dev, lpips_net=lpips_net.value,
        bootstrap=Bootstrap(resamples=resamples, set_resamples=set_resamples), diff_gain=diff_gain,
    )


def _print_verdicts(result: dict, out: Path) -> None:
    for line in result["verdicts"]:
        typer.echo(line)
    typer.echo(f"sagevideo: wrote {out / 'metrics.json'} and {out / 'report.html'}")


_MetricsOption = Annotated[
    list[str] | None,
    typer.Option("--metrics", "-m", help="Metrics to compute (repeatable or comma-separated): psnr, ssim, lpips, "
                 "clipsim, clip_t, fid, kid, or all (default). Metrics whose weights are missing are skipped."),
]
_WeightsOption = Annotated[
    Path | None,
    typer.Option("--weights", help="Folder of the metrics' weights (default $SAGEVIDEO_WEIGHTS or "
                 "~/.cache/sagevideo/weights; see `sagevideo check-weights`)."),
]
_LpipsOption = Annotated[LpipsNet, typer.Option(help="LPIPS backbone.")]
_ResamplesOption = Annotated[int, typer.Option(min=100, help="Bootstrap resamples over prompts (95% CI).")]
_SetResamplesOption = Annotated[
    int, typer.Option(min=10, help="Bootstrap resamples for FID/KID (each recomputes them from cached features).")
]
_GainOption = Annotated[float, typer.Option(min=1.0, help="Amplification of |test - reference| in difference videos.")]


@app.command("eval")
def eval_command(
    ref_dir: Annotated[Path, typer.Argument(help="Reference output folder (full precision), with manifest.jsonl.")],
    test_dir: Annotated[Path, typer.Argument(help="Test output folder (e.g. quantized), with manifest.jsonl.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Folder for metrics.json, report.html and figures.")] = ...,
    metrics: _MetricsOption = None,
    weights: _WeightsOption = None,
    noise_ref: Annotated[
        Path | None,
        typer.Option("--noise-ref", help="A second full-precision run with the same seeds: the noise floor."),
    ] = None,
    device: Annotated[Device, typer.Option(help="Where the metric networks run.")] = Device.auto,
    lpips_net: _LpipsOption = LpipsNet.alex,
    resamples: _ResamplesOption = 1000,
    set_resamples: _SetResamplesOption = 50,
    diff_gain: _GainOption = 8.0,
) -> None:
    """Compare two output folders (paired by prompt and seed): metrics.json and report.html in --out.

    Exit codes: 0 done, 1 a metric's weights are present but could not be loaded (the other metrics
    are still written), 2 bad input (folders that do not pair, unknown metric; nothing was loaded).
    """
    from sagevideo.eval.evaluate import EvalInputError, MetricModelError, PairingError, evaluate

    try:
        options = _eval_options(metrics, weights, device, lpips_net, resamples, set_resamples, diff_gain)
        result = evaluate(
            ref_dir, test_dir, out=out, noise_ref=noise_ref, options=options,
            echo=lambda line: typer.echo(line, err=True),
            progress=lambda text: typer.echo(f"sagevideo eval: {text}", err=True),
        )
    except (EvalInputError, PairingError) as err:
        raise fail("eval", str(err), EXIT_BAD_INPUT) from None
    except MetricModelError as err:
        raise fail("eval", str(err), EXIT_FAILED) from None
    _print_verdicts(result, out)
    _fail_for_lost_metrics("eval", result)


def _fail_for_lost_metrics(command: str, result: dict) -> None:
    """Exit 1 (after everything was written) when a metric's weights are present but broken."""
    if result.get("failed"):
        lost = ", ".join(result["failed"])
        message = f"{lost}: weights present but not loadable (see above); the other metrics are in metrics.json"
        raise fail(command, message, EXIT_FAILED)


@app.command()
def ab(
    job_file: Annotated[
        Path, typer.Argument(help="Job file (YAML/TOML/text, as for `generate`) without attention, pv or plan.")
    ],
    out: Annotated[Path, typer.Option("--out", "-o", help="Folder for the three arms and the evaluation.")] = ...,
    model: Annotated[str, typer.Option(help="'tiny' (built in) or a local diffusers folder.")] = "tiny",
    plan: Annotated[Path | None, typer.Option(help="Attention-plan JSON for the quantized arm.")] = None,
    pv: Annotated[
        PV | None,
        typer.Option(
            help="P·V precision of the quantized arm (default: the plan's, else auto: FP8 on sm89+ GPUs, else FP16)."
        ),
    ] = None,
    backend: Annotated[Backend, typer.Option(help="sageattn backend of the quantized arm.")] = Backend.auto,
    device: Annotated[Device, typer.Option(help="auto = CUDA when available, else CPU.")] = Device.auto,
    attention_probe: Annotated[
        bool, typer.Option("--attention-probe", help="Also measure each layer's attention error (cosine, rel-L1, "
                           "RMSE vs fp32) by re-running the quantized jobs with a probing router.")
    ] = False,
    noise_floor: Annotated[
        bool, typer.Option("--noise-floor/--no-noise-floor", help="Run full precision twice (the noise floor).")
    ] = True,
    metrics: _MetricsOption = None,
    weights: _WeightsOption = None,
    lpips_net: _LpipsOption = LpipsNet.alex,
    resamples: _ResamplesOption = 1000,
    set_resamples: _SetResamplesOption = 50,
    diff_gain: _GainOption = 8.0,
    progress: Annotated[bool, typer.Option("--progress/--no-progress", help="Show progress bars.")] = True,
) -> None:
    """A/B test: run JOB_FILE quantized and at full precision (twice: the noise floor), then evaluate.

    Same prompts, seeds and initial latents in every arm; metrics.json and report.html go to --out.
    Re-running resumes. Exit codes: 0 done, 1 a job or a model load failed, 2 bad input (before
    anything ran), 130 interrupted.
    """
    from sagevideo.eval.evaluate import EvalInputError, MetricModelError, PairingError
    from sagevideo.experiments.ab import ABFailed
    from sagevideo.experiments.ab import ab as run_ab
    from sagevideo.generation.generate import BatchStopped, ModelLoadError
    from sagevideo.jobs.specs import InputError

    try:
        options = _eval_options(metrics, weights, device, lpips_net, resamples, set_resamples, diff_gain)
        result = run_ab(
            job_file, out=out, model=model, plan=plan, pv=pv.value if pv else None, backend=backend.value,
            device=device.value, attention_probe=attention_probe, noise_floor=noise_floor, options=options,
            progress=progress, echo=lambda line: typer.echo(line, err=True),
        )
    except (InputError, EvalInputError, PairingError) as err:
        raise fail("ab", str(err), EXIT_BAD_INPUT) from None
    except (ABFailed, ModelLoadError, MetricModelError, BatchStopped) as err:
        raise fail("ab", str(err), EXIT_FAILED) from None
    except KeyboardInterrupt as stop:  # BatchInterrupted says whether Ctrl-C (130) or SIGTERM (143)
        typer.echo("sagevideo ab: interrupted; re-run the same command to resume", err=True)
        raise typer.Exit(getattr(stop, "exit_code", _EVAL_EXIT_INTERRUPTED)) from None
    _print_verdicts(result, out)
    _fail_for_lost_metrics("ab", result)


@app.command("check-weights")
def check_weights(
    weights: _WeightsOption = None,
    lpips_net: _LpipsOption = LpipsNet.alex,
) -> None:
    """List each evaluation metric's weight files: present, missing, and where to put them.

    Nothing is ever downloaded. Exit code 0 when every metric can run, 1 when some would be skipped,
    2 bad input.
    """
    from sagevideo.eval.weights import report_lines

    if weights is not None and weights.exists() and not weights.is_dir():
        raise fail("check-weights", f"--weights {weights}: is a file; give the folder that holds the weights",
                   EXIT_BAD_INPUT)
    lines, complete = report_lines(weights, lpips_net=lpips_net.value)
    for line in lines:
        typer.echo(line)
    if not complete:
        raise typer.Exit(EXIT_FAILED)
