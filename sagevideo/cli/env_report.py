"""What `sagevideo env` prints: versions, devices, the attention backend registry (each backend,
available on each device or why not) and which kernel plan runs where, and why."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import platform
import sys
import textwrap
from dataclasses import dataclass

import torch

from sagevideo.attention import backends
from sagevideo.kernels import plans

PACKAGES = ("torch", "triton", "diffusers", "transformers", "ray", "torchmetrics", "imageio-ffmpeg")
STARTUP_PACKAGES = ("torch", "diffusers", "transformers")  # the bulk of a worker's imports


@dataclass(frozen=True)
class PlanRow:
    device: str
    head_dim: int
    pv: str
    runs: str  # "triton", "gluon" (warp-specialized sm90 kernel) or "sdpa (fallback)"
    detail: str  # the plan, or why the kernels cannot run


def package_versions() -> dict[str, str | None]:
    """Installed versions from package metadata (nothing is imported)."""
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def devices() -> list[torch.device]:
    found = [torch.device("cpu")]
    if torch.cuda.is_available():
        found += [torch.device("cuda", i) for i in range(torch.cuda.device_count())]
    return found


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        return f"{device} {torch.cuda.get_device_name(device)} (sm{major}{minor})"
    return f"{device} ({platform.processor() or platform.machine()})"


@dataclass(frozen=True)
class BackendRow:
    backend: str
    device: str
    problem: str  # '' = available there


def backend_rows() -> list[BackendRow]:
    """For each registered backend and device: can it compute a float16 call at head dim 64 with
    16-bit P·V and no mask there, or why not (head dims and PV modes: `plan_rows`)."""
    rows = []
    for spec in backends.registered():
        for device in devices():
            call = backends.AttentionCall(device, torch.float16, 64, pv="fp16")
            rows.append(BackendRow(spec.backend.value, str(device), spec.problem(call)))
    return rows


def plan_rows() -> list[PlanRow]:
    """For each device, head dim (64, 128) and PV mode: what sageattn(backend="auto") runs on
    float16 inputs without a mask."""
    rows = []
    for device in devices():
        for head_dim in (64, 128):
            for pv in plans.PV_MODES:
                call = backends.AttentionCall(device, torch.float16, head_dim, pv=pv)
                chosen, reason = backends.choose(backends.AUTO, call)
                if chosen is not backends.Backend.TRITON:
                    rows.append(PlanRow(str(device), head_dim, pv, "sdpa (fallback)", reason))
                    continue
                choice = plans.select_plan(device, head_dim, pv)
                detail = choice.plan.describe() + (f"; {choice.reason}" if choice.reason else "")
                rows.append(PlanRow(str(device), head_dim, pv, choice.plan.kernel, detail))
    return rows


def report_lines() -> list[str]:
    lines = ["sagevideo environment", ""]
    for name, version in package_versions().items():
        lines.append(f"  {name:15s} {version or 'not installed'}")
    lines.append(f"  {'python':15s} {platform.python_version()}")
    lines.append(f"  {'CUDA (torch)':15s} {torch.version.cuda or 'none (CPU build)'}")
    interpret = os.environ.get("TRITON_INTERPRET", "")
    lines.append(f"  {'TRITON_INTERPRET':15s} {interpret or 'unset'}")
    lines += ["", "devices:"]
    lines += [f"  {device_name(d)}" for d in devices()]
    lines += ["", "attention backends (backend='auto' runs the first of "
              f"{', '.join(b.value for b in backends.AUTO_ORDER)} that can, else {backends.FALLBACK.value}, "
              "and records why):"]
    problems = {(row.backend, row.device): row.problem for row in backend_rows()}
    for spec in backends.registered():
        lines.append(f"  {spec.backend.value:10s} {spec.summary}")
        if spec.constraints:
            needs = "needs: " + "; ".join(c.name for c in spec.constraints)
            lines += textwrap.wrap(needs, width=110, initial_indent=" " * 13, subsequent_indent=" " * 20)
        for device in devices():
            problem = problems[(spec.backend.value, str(device))]
            lines.append(f"  {'':10s} {str(device):8s} {'available' if not problem else 'not here: ' + problem}")
    lines += ["", "kernel plan per device (fp16/bf16 inputs, backend='auto'):"]
    for row in plan_rows():
        lines.append(f"  {row.device:8s} d{row.head_dim:<4d} pv={row.pv:5s} -> {row.runs:16s} {row.detail}")
    lines += ["", "Other head dims <= 128 are zero-padded to 64/128 in-kernel; fp32 inputs, CPU tensors, "
              "non-key-padding masks and head dims > 128 run full-precision SDPA."]
    lines += [f"{plans.SM90_KERNEL_ENV}={plans.sm90_kernel_wanted()}: on sm90, 'auto' (default) runs the "
              "warp-specialized Gluon kernel where it measured faster (FP8 PV, head dim 128; calls without "
              "causal/mask/LSE), 'triton' the plain-Triton kernel everywhere, 'gluon' the Gluon kernel "
              "wherever it runs (FP8 PV)."]
    lines += ["", *recipe_lines()]
    return lines


def recipe_lines() -> list[str]:
    """What this machine can run of the speed recipe (--compile, --linear, --cache)."""
    from sagevideo.pipelines.recipe import capabilities

    can = capabilities()
    return [
        f"speed recipe on {can['device']} (--compile, --linear, --cache; checked again for each batch):",
        f"  {'torchao':15s} {can['torchao'] or 'not installed (pip install torchao, for --linear fp8)'}",
        f"  {'--linear fp8':15s} {can['fp8_linears']}",
        f"  {'--compile':15s} regional with Inductor: {can['inductor']} (--compile-backend eager always traces)",
        f"  {'--cache':15s} diffusers hooks here: {', '.join(can['diffusers_caches']) or 'none'}",
        f"  {'compile cache':15s} {can['compile_cache']} ($SAGEVIDEO_COMPILE_CACHE overrides; "
        "TORCHINDUCTOR_CACHE_DIR and TRITON_CACHE_DIR, when set, win)",
        f"  {'bytecode':15s} {bytecode_line()}",
    ]


def without_bytecode(sources: list[str]) -> list[str]:
    """The Python source files among `sources` with no cached bytecode where this interpreter
    looks for it (`__pycache__` beside them, or under PYTHONPYCACHEPREFIX)."""
    return [src for src in sources if not os.path.exists(importlib.util.cache_from_source(src))]


def bytecode_line() -> str:
    """Whether a new worker process finds its big imports byte-compiled. Without bytecode, and
    with writing it off (PYTHONDONTWRITEBYTECODE, common in container images), every process
    compiles torch's, diffusers' and transformers' sources again: on an H200 host that was about
    12 s of a worker's start-up (docs/recipe.md)."""
    sources = []
    for name in STARTUP_PACKAGES:
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.origin and spec.origin.endswith(".py"):
            sources.append(spec.origin)
    missing = [os.path.basename(os.path.dirname(src)) for src in without_bytecode(sources)]
    if not missing:
        return "cached for " + ", ".join(STARTUP_PACKAGES) + " (worker start-ups import them compiled)"
    if not sys.dont_write_bytecode:
        return f"none yet for {', '.join(missing)}: written by the first process that imports them"
    return (f"none for {', '.join(missing)}, and PYTHONDONTWRITEBYTECODE is set: every worker start compiles "
            "their sources again (about 12 s on an H200 host); byte-compile them once (python -m compileall "
            "on site-packages, as pip install does) or give PYTHONPYCACHEPREFIX=DIR with that variable unset")
