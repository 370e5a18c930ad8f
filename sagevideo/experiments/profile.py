"""`sagevideo profile`: where one denoising step's time goes, and what each speed-up lever can give.

Runs the transformer forwards of one denoising step (`pipelines.forwards.build_step`: one call per
guidance branch the pipeline makes, at the model's real size with random weights, or a tiny one)
under `torch.profiler`, once to warm up and once measured, and splits the measured self time of
every op (device time on a GPU, CPU time on the CPU) into attention (SDPA and its kernels,
sagevideo's ops), linears (aten::linear / addmm / mm / _scaled_mm and what they call) and the
rest: an op counts under the first category met from the outermost op that called it down.
Amdahl's bound of each lever: a part with share s made k times faster makes the step at most
1 / ((1 - s) + s / k) times faster.

Random weights, because the time split depends on the shapes, not on the values.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

CATEGORIES = ("attention", "linear", "rest")
SPEEDUPS = (2.0, 3.0, math.inf)
_ATTENTION_OPS = ("scaled_dot_product", "flash_attention", "efficient_attention", "cudnn_attention", "sagevideo::")
_LINEAR_OPS = ("aten::linear", "aten::addmm", "aten::mm", "aten::_scaled_mm", "aten::matmul", "aten::bmm")
_BOOKKEEPING = ("sagevideo::record_backend", "sagevideo::note_attention")  # records, not attention time


class ProfileConfig(BaseModel):
    """What to profile: a transformer config (`pipelines.forwards.CONFIGS`), its video size, where."""

    model_config = ConfigDict(extra="forbid")
    model: str = "tiny-cogvideox"
    frames: int | None = Field(None, ge=1)
    height: int | None = Field(None, ge=16)
    width: int | None = Field(None, ge=16)
    steps: int = Field(1, ge=1)
    device: str = "auto"
    dtype: Literal["bfloat16", "float16", "float32"] | None = None  # None: bf16 on a GPU, fp32 on the CPU
    json_out: Path | None = None
    plot: Path | None = None

    @field_validator("model")
    @classmethod
    def _known(cls, value: str) -> str:
        from sagevideo.pipelines.forwards import known_config

        return known_config(value)


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

    def table(self) -> str:
        """The console table: ms and share per part, and each lever's bounds."""
        head = "  ".join(f"{_k(k) + ' faster':>12s}" for k in SPEEDUPS)
        lines = [f"{self.model} on {self.device}: {self.steps} step(s) of {self.forwards_per_step} forward(s), "
                 f"{self.tokens} video tokens", f"{'part':10s} {'ms':>10s} {'share':>7s}   step bound: {head}"]
        for cat in CATEGORIES:
            bounds = "" if cat == "rest" else "  ".join(f"{'≤ ' + format(b, '.2f') + '×':>12s}"
                                                      for b in self.bounds[cat].values())
            lines.append(f"{cat:10s} {self.seconds[cat] * 1e3:10.1f} {self.shares[cat]:7.1%}   {'':12s}{bounds}")
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
    total = sum(seconds[c] for c in CATEGORIES)
    if total <= 0:
        raise ValueError("the profile recorded no op time")
    shares = {c: seconds[c] / total for c in CATEGORIES}
    bounds = {c: {_k(k): amdahl(shares[c], k) for k in SPEEDUPS} for c in CATEGORIES if c != "rest"}
    return ProfileReport(seconds={c: seconds[c] for c in CATEGORIES}, shares=shares, bounds=bounds, **fields)


def category_of(names: list[str]) -> str:
    """The category of an op whose callers, outermost first, and itself are `names`."""
    for name in names:
        if any(part in name for part in _ATTENTION_OPS) and name not in _BOOKKEEPING:
            return "attention"
        if name in _LINEAR_OPS:
            return "linear"
    return "rest"


def split_events(events, use_device: bool) -> dict[str, float]:
    """Per-category seconds of profiler `events` (FunctionEvents): each op's self time under the
    category of its outermost classified caller. Only the ops' (CPU-side) events count: on a GPU
    an op's self device time already holds its kernels' time, and the kernel events the profiler
    also lists (no CPU parent) would count it a second time, as "rest"."""
    from torch.autograd import DeviceType

    seconds = dict.fromkeys(CATEGORIES, 0.0)
    for event in events:
        if getattr(event, "device_type", DeviceType.CPU) != DeviceType.CPU:
            continue
        chain, parent = [], event
        while parent is not None:
            chain.append(parent.name)
            parent = parent.cpu_parent
        self_us = event.self_device_time_total if use_device else event.self_cpu_time_total
        seconds[category_of(chain[::-1])] += self_us / 1e6
    return seconds


def run_profile(config: ProfileConfig) -> ProfileReport:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from sagevideo.pipelines.forwards import build_step

    device = config.device if config.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = getattr(torch, config.dtype or ("bfloat16" if device.startswith("cuda") else "float32"))
    step = build_step(config.model, device, dtype, frames=config.frames, height=config.height, width=config.width)
    step.run()  # warm-up: allocator, kernels, autotuning
    use_device = device.startswith("cuda")
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if use_device else [])
    with profile(activities=activities) as prof:
        for _ in range(config.steps):
            step.run()
        if use_device:
            torch.cuda.synchronize()
    report = report_from_seconds(
        split_events(prof.events(), use_device), model=config.model, device=device, steps=config.steps,
        forwards_per_step=len(step.forwards), tokens=step.tokens,
    )
    if config.json_out is not None:
        config.json_out.write_text(json.dumps(report.model_dump(), indent=2, default=str))
    if config.plot is not None:
        plot_report(report, config.plot)
    return report


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
