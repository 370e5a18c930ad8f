"""`sagevideo profile`: where one denoising step's time goes, and what each speed-up lever can give.

Runs the transformer forwards of one denoising step (`pipelines.forwards.build_step`: one call per
guidance branch the pipeline makes, at the model's real size with random weights, or a tiny one)
under `torch.profiler`, once to warm up and once measured, and splits the measured self time of
every op (device time on a GPU, CPU time on the CPU) into attention (SDPA and its kernels,
sagevideo's ops), block-sparse tile selection (whatever runs inside a sparse call's selection
range, `pipelines.sparse.SELECTION_RANGE`: 0 for dense runs), linears (aten::linear / addmm / mm /
_scaled_mm and what they call) and the rest: an op counts under the first category met from the
outermost op that called it down, selection before any other.
Amdahl's bound of each lever: a part with share s made k times faster makes the step at most
1 / ((1 - s) + s / k) times faster.

With `recipe` (a `bench forward` recipe name, e.g. fp8-compile-sage) the model runs as that recipe
makes it: sagevideo attention installed (block-sparse with `--sparse`, as `bench forward --sparse`
runs it: eager sage recipes), torchao FP8 linears, regional torch.compile. Inside
compiled graphs no aten op surrounds most kernels, so there each kernel's device time is counted by
its name: sagevideo's own kernels (`attention.backends.DEVICE_KERNELS`) and SDPA's as attention,
GEMM libraries' and Inductor's matmul templates as linears, with the FP8 activations' scale
reductions (`abs_amax` kernels, whatever Inductor fused them with), the rest (Inductor's fused
pointwise and reduction kernels) as rest. The report also lists the step's largest kernels with their category.

Random weights, because the time split depends on the shapes, not on the values.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError, field_validator

from sagevideo.errors import InputError
from sagevideo.experiments.bench.timing import BenchOptions, ModelConfigOptions
from sagevideo.jobs.sparse import SparseOptions, is_sparse

CATEGORIES = ("attention", "selection", "linear", "rest")
SPEEDUPS = (2.0, 3.0, math.inf)
_ATTENTION_OPS = ("scaled_dot_product", "flash_attention", "efficient_attention", "cudnn_attention", "sagevideo::")
_LINEAR_OPS = ("aten::linear", "aten::addmm", "aten::mm", "aten::_scaled_mm", "aten::matmul", "aten::bmm")
_BOOKKEEPING = ("sagevideo::record_backend", "sagevideo::note_attention")  # records, not attention time
_SELECTION = "sagevideo::select_tiles"  # `pipelines.sparse.SELECTION_RANGE`: a sparse call's tile selection
# Kernel names, where no classified op surrounds a kernel (compiled graphs). Attention is matched
# first: CUTLASS's memory-efficient attention kernels are named fmha_cutlass*.
_ATTENTION_KERNELS = ("fmha", "flash", "sdpa", "attention")
# FP8 linears' dynamic activation scales (`x.abs().amax()` per row) are reductions Inductor may
# fuse with the op before them (a GELU, a layer norm) rather than with the `_scaled_mm`: "abs_amax"
# or "abs_add_amax" (the norm's add between) in the name marks them as the linears'.
_LINEAR_KERNELS = ("gemm", "nvjet", "xmma", "cutlass", "triton_tem_fused_mm", "triton_tem_fused_addmm",
                   "triton_tem_fused__scaled_mm", "scaled_mm", "abs_amax", "abs_add_amax")
TOP_KERNELS = 12


class ProfileConfig(ModelConfigOptions, BenchOptions, SparseOptions):
    """What to profile: a transformer config (`ModelConfigOptions`: `pipelines.forwards.CONFIGS`,
    its video size), where and how long it may take (`BenchOptions`), block-sparse or not
    (`SparseOptions`, with an eager sage recipe); every field is an option of `sagevideo profile` but
    dtype (None: bf16 on a GPU, fp32 on the CPU)."""

    steps: int = Field(1, ge=1, description="denoising steps measured (after one warm-up step)")
    recipe: str | None = Field(None, description="run the model as this bench forward recipe, "
                               "[fp8-](eager|compile)-(cudnn|sdpa|sage)[-first-block|-taylorseer], e.g. "
                               "fp8-compile-sage; default: stock")
    dtype: Literal["bfloat16", "float16", "float32"] | None = None
    plot: Path | None = Field(None, description="write a PNG of the split and the bounds here")

    @field_validator("recipe")
    @classmethod
    def _known_recipe(cls, value: str | None) -> str | None:
        from sagevideo.experiments.bench.forward import parse_recipe_name

        if value is not None:
            parse_recipe_name(value)  # ValueError naming the form
        return value

    @property
    def height(self) -> int | None:
        return self.size()["height"]

    @property
    def width(self) -> int | None:
        return self.size()["width"]

    @classmethod
    def build(cls, **options: Any) -> ProfileConfig:
        """A config; InputError naming each bad option ('--frames: ...'), or a size the model cannot take."""
        from sagevideo.jobs.problems import problem_parts

        try:
            config = cls(**options)
        except ValidationError as err:
            lines = [f"--{field.replace('_', '-')}: {msg}" for field, msg, _ in problem_parts(err)]
            raise InputError("; ".join(lines)) from None
        problem = config.size_problem(config.model)  # a latent shape the model cannot take
        if problem:
            raise InputError(problem)
        return config


class ProfileReport(BaseModel):
    """seconds: per category, summed over the measured steps; shares sum to 1; bounds[lever][k]:
    the whole step's speed-up bound when that lever's part is k times faster ("inf": removed)."""

    model: str
    device: str
    steps: int
    forwards_per_step: int
    tokens: int
    seconds: dict[str, float]
    shares: dict[str, float]
    bounds: dict[str, dict[str, float]]
    recipe: str | None = None
    wall_seconds: float | None = None  # the measured steps' wall time, profiler on (its overhead included)
    kernels: list[dict] = []  # the largest kernels: name, category, ms (summed over the steps), calls

    def table(self) -> str:
        """The console table: ms and share per part, and each lever's bounds."""
        head = "  ".join(f"{_k(k) + ' faster':>12s}" for k in SPEEDUPS)
        recipe = f", recipe {self.recipe}" if self.recipe else ""
        lines = [f"{self.model} on {self.device}{recipe}: {self.steps} step(s) of {self.forwards_per_step} "
                 f"forward(s), {self.tokens} video tokens",
                 f"{'part':10s} {'ms':>10s} {'share':>7s}   step bound: {head}"]
        for cat in CATEGORIES:
            bounds = "" if cat == "rest" else "  ".join(f"{'≤ ' + format(b, '.2f') + '×':>12s}"
                                                      for b in self.bounds[cat].values())
            lines.append(f"{cat:10s} {self.seconds[cat] * 1e3:10.1f} {self.shares[cat]:7.1%}   {'':12s}{bounds}")
        if self.wall_seconds:
            counted = sum(self.seconds.values())
            over = (" — more than the wall time: kernels overlapped (several streams) or were counted twice; "
                    "the shares are of the counted time") if counted > 1.02 * self.wall_seconds else ""
            lines.append(f"counted {counted * 1e3:.1f} ms of op time in {self.wall_seconds * 1e3:.1f} ms of wall time"
                         f"{over}")
        if self.kernels:
            lines.append(f"largest kernels ({'ms':>8s}, calls, part):")
            lines += [f"  {k['ms']:10.1f} {k['calls']:6d}  {k['category']:9s} {k['name'][:90]}" for k in self.kernels]
        return "\n".join(lines)


def _k(k: float) -> str:
    return "inf" if math.isinf(k) else f"{k:g}x"


def amdahl(share: float, speedup: float) -> float:
    """Whole-step speed-up when a part with `share` of the time runs `speedup` times faster."""
    rest = 1.0 - share
    part = 0.0 if math.isinf(speedup) else share / speedup
    return math.inf if rest + part <= 0 else 1.0 / (rest + part)


def report_from_seconds(seconds: dict[str, float], **fields) -> ProfileReport:
    """A report from per-category seconds (a measured profile or a synthetic one)."""
    seconds = {c: seconds.get(c, 0.0) for c in CATEGORIES}  # a category never met took no time
    total = sum(seconds.values())
    if total <= 0:
        raise ValueError("the profile recorded no op time")
    shares = {c: seconds[c] / total for c in CATEGORIES}
    bounds = {c: {_k(k): amdahl(shares[c], k) for k in SPEEDUPS} for c in CATEGORIES if c != "rest"}
    return ProfileReport(seconds=seconds, shares=shares, bounds=bounds, **fields)


def category_of(names: list[str]) -> str:
    """The category of an op whose callers, outermost first, and itself are `names`."""
    if _SELECTION in names:  # inside an attention layer, but not attention's kernels
        return "selection"
    for name in names:
        if any(part in name for part in _ATTENTION_OPS) and name not in _BOOKKEEPING:
            return "attention"
        if name in _LINEAR_OPS:
            return "linear"
    return "rest"


def kernel_category(name: str) -> str:
    """The category of a device kernel by its name alone (no classified op around it)."""
    from sagevideo.attention.backends import DEVICE_KERNELS

    if any(kernel in name for kernel in DEVICE_KERNELS) or any(part in name for part in _ATTENTION_KERNELS):
        return "attention"
    if any(part in name for part in _LINEAR_KERNELS):
        return "linear"
    return "rest"


def split_events(events, use_device: bool, kernels: dict[str, list] | None = None) -> dict[str, float]:
    """Per-category seconds of profiler `events` (FunctionEvents): each op's self time under the
    category of its outermost classified caller; on a GPU, where no classified op surrounds an op,
    each of its kernels under `kernel_category` of its name. Only the ops' (CPU-side) events count:
    on a GPU an op's self device time already holds its kernels' time, and the kernel events the
    profiler also lists (no CPU parent) would count it a second time, as "rest". A kernel the
    profiler attaches to several CPU events of one correlation id (CUPTI's own "Activity Buffer
    Request" inside the op that launched it) counts once, for the first. `kernels`, if given,
    collects name -> [category, seconds, calls] of every device kernel."""
    from torch.autograd import DeviceType

    seconds = dict.fromkeys(CATEGORIES, 0.0)
    credited: set[int] = set()  # correlation ids whose kernels were counted
    for event in events:
        if getattr(event, "device_type", DeviceType.CPU) != DeviceType.CPU:
            continue
        own_kernels = getattr(event, "kernels", []) if use_device else []
        if own_kernels:
            if event.id in credited:
                continue
            credited.add(event.id)
        chain, parent = [], event
        while parent is not None:
            chain.append(parent.name)
            parent = parent.cpu_parent
        category = category_of(chain[::-1])
        if not own_kernels:
            self_us = event.self_device_time_total if use_device else event.self_cpu_time_total
            seconds[category] += self_us / 1e6
        for kernel in own_kernels:
            kind = category if category != "rest" else kernel_category(kernel.name)
            seconds[kind] += kernel.duration / 1e6
            if kernels is not None:
                entry = kernels.setdefault(kernel.name, [kind, 0.0, 0])
                entry[1] += kernel.duration / 1e6
                entry[2] += 1
    return seconds


def largest_kernels(kernels: dict[str, list], count: int = TOP_KERNELS) -> list[dict]:
    """The `count` kernels with the most device time, from `split_events`' `kernels`."""
    ranked = sorted(kernels.items(), key=lambda item: -item[1][1])[:count]
    return [dict(name=name, category=kind, ms=secs * 1e3, calls=calls) for name, (kind, secs, calls) in ranked]


@contextlib.contextmanager
def _quiet_kineto() -> Iterator[None]:
    """Kineto (torch.profiler's library) writes stage lines ('USDT: ... profiler_start') to the
    process's stderr from C++ at its default log level; level 6 keeps them back. Kineto reads the
    level once, at its first use in a process: a `sagevideo profile` run is that; a process that
    profiled before keeps the level it had. A level the user set stays theirs."""
    if "KINETO_LOG_LEVEL" in os.environ:
        yield
        return
    os.environ["KINETO_LOG_LEVEL"] = "6"
    try:
        yield
    finally:
        os.environ.pop("KINETO_LOG_LEVEL", None)


def run_profile(config: ProfileConfig) -> ProfileReport:
    """Build the model and profile its steps (see the module doc). Raises InputError, before
    building, for a recipe this machine cannot run, an unwritable --json or --plot, and a run that
    cannot fit in memory or would take longer than `config.max_hours` here (`run_budget`)."""
    import sys

    import torch
    from torch.profiler import ProfilerActivity, profile
    from tqdm.auto import tqdm

    from sagevideo.experiments.run_budget import check_model_run
    from sagevideo.pipelines.forwards import build_step

    device = config.device if config.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    dtype_name = config.dtype or ("bfloat16" if device.startswith("cuda") else "float32")
    dtype = getattr(torch, dtype_name)
    _check_recipe(config.recipe, device, dtype)  # before building: the model may take minutes
    if is_sparse(config.sparse):
        from sagevideo.experiments.bench.forward import check_sparse_recipes

        check_sparse_recipes(config.sparse, [config.recipe] if config.recipe else [], option="--recipe")
    from sagevideo.outputs.files import writable_file

    for path, option, example in ((config.json_out, "--json", "profile.json"), (config.plot, "--plot", "profile.png")):
        if path is not None:  # found now, not after a profile of minutes
            writable_file(path, option, InputError, example)
    from sagevideo.experiments.bench.forward import parse_recipe_name

    sage = config.recipe is not None and parse_recipe_name(config.recipe)["attention"] == "sage"
    size = dict(frames=config.frames, height=config.height, width=config.width)
    steps = {"sage" if sage else "stock": 1 + config.steps}  # the warm-up and the measured steps
    estimate = check_model_run(config.model, size, device, dtype_name, steps=steps, max_hours=config.max_hours)
    step = build_step(config.model, device, dtype, **size)
    with _as_recipe(step.model, config.recipe, device, config.sparse), \
            tqdm(total=1 + config.steps, desc="profile", unit="step", file=sys.stderr, disable=not estimate.long,
                 dynamic_ncols=True) as bar:
        use_device = device.startswith("cuda")
        sync = torch.cuda.synchronize if use_device else (lambda: None)
        step.run()  # warm-up: allocator, kernels, autotuning, compilation
        sync()  # else the warm-up's queued kernels run inside the profiled window
        bar.update()
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if use_device else [])
        with _quiet_kineto(), profile(activities=activities) as prof:
            start = time.perf_counter()
            for _ in range(config.steps):
                step.run()
                bar.update()  # a few microseconds of Python in the profile, against a step of minutes
            sync()
            wall = time.perf_counter() - start
    kernels: dict[str, list] = {}
    report = report_from_seconds(
        split_events(prof.events(), use_device, kernels), model=config.model, device=device, steps=config.steps,
        forwards_per_step=len(step.forwards), tokens=step.tokens, recipe=config.recipe,
        kernels=largest_kernels(kernels), wall_seconds=wall,
    )
    if config.json_out is not None:
        config.json_out.write_text(json.dumps(report.model_dump(), indent=2, default=str))
    if config.plot is not None:
        plot_report(report, config.plot)
    return report


def _check_recipe(name: str | None, device: str, dtype) -> None:
    """InputError where this machine cannot run recipe `name` (FP8 linears without FP8 tensor cores)."""
    from sagevideo.experiments.bench.forward import parse_recipe_name
    from sagevideo.pipelines.recipe import fp8_linear_problem

    if name is None:
        return
    spec = parse_recipe_name(name)
    if spec["attention"] == "sage" and spec["compile"] != "none" and not device.startswith("cuda"):
        raise InputError(f"--recipe {name}: on the CPU sagevideo attention is the reference emulation, whose "
                         "plain aten ops inside a compiled graph cannot be told from the rest; profile "
                         f"{name.replace('compile', 'eager')} here, or {name} on a GPU")
    problem = fp8_linear_problem(device, str(dtype).removeprefix("torch.")) if spec["linear"] == "fp8" else None
    if problem:
        raise InputError(f"--recipe {name}: {problem}")


@contextlib.contextmanager
def _as_recipe(model, name: str | None, device: str, sparse: str | None = None) -> Iterator[None]:
    """Run `model` as recipe `name` makes it (as `bench forward` does, block-sparse with a `sparse`
    setting), or stock when None."""
    if name is None:
        yield
        return
    from sagevideo.experiments.bench.forward import (
        apply_recipe_name,
        cache_context,
        parse_recipe_name,
        recipe_backends,
        stock_attention_order,
    )

    compile_backend, backend = recipe_backends(device)
    _, applied = apply_recipe_name(model, name, backend=backend, compile_backend=compile_backend, sparse=sparse)
    with stock_attention_order(parse_recipe_name(name)["attention"], device), cache_context(model, applied.recipe):
        yield


def plot_report(report: ProfileReport, path: Path) -> None:
    """A bar of the step's time split and the Amdahl bounds of each lever, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.5))
    bottom = 0.0
    for cat in CATEGORIES:
        left.bar([0], [report.shares[cat]], bottom=bottom, label=f"{cat} {report.shares[cat]:.0%}")
        bottom += report.shares[cat]
    left.set_xticks([]), left.set_ylabel("share of the step"), left.legend(), left.set_title(report.model)
    levers = [c for c in CATEGORIES if c != "rest"]
    width = 0.8 / len(SPEEDUPS)
    for i, k in enumerate(SPEEDUPS):
        values = [min(report.bounds[c][_k(k)], 20.0) for c in levers]
        right.bar([j + i * width for j in range(len(levers))], values, width, label=f"part {_k(k)} faster")
    right.set_xticks([j + width for j in range(len(levers))], levers)
    right.set_ylabel("step speed-up bound (×)"), right.legend(), right.set_title("Amdahl bounds")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
