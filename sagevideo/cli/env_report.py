"""What `sagevideo env` prints: versions, devices, and which kernel plan runs where, and why."""

from __future__ import annotations

import importlib.metadata
import os
import platform
from dataclasses import dataclass

import torch

from sagevideo.kernels import plans

PACKAGES = ("torch", "triton", "diffusers", "transformers", "ray", "torchmetrics", "imageio-ffmpeg")


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


def plan_rows() -> list[PlanRow]:
    """For each device, head dim (64, 128) and PV mode: what sageattn(backend="auto") runs."""
    rows = []
    triton_ok = package_versions()["triton"] is not None
    for device in devices():
        for head_dim in (64, 128):
            for pv in plans.PV_MODES:
                choice = plans.select_plan(device, head_dim, pv)
                if choice.plan is not None and not triton_ok:
                    rows.append(PlanRow(str(device), head_dim, pv, "sdpa (fallback)", "triton is not installed"))
                elif choice.plan is not None:
                    detail = choice.plan.describe() + (f"; {choice.reason}" if choice.reason else "")
                    rows.append(PlanRow(str(device), head_dim, pv, choice.plan.kernel, detail))
                else:
                    rows.append(PlanRow(str(device), head_dim, pv, "sdpa (fallback)", choice.reason))
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
    lines += ["", "kernel plan per device (fp16/bf16 inputs, backend='auto'):"]
    for row in plan_rows():
        lines.append(f"  {row.device:8s} d{row.head_dim:<4d} pv={row.pv:5s} -> {row.runs:16s} {row.detail}")
    lines += ["", "Other head dims <= 128 are zero-padded to 64/128 in-kernel; fp32 inputs, CPU tensors, "
              "non-key-padding masks and head dims > 128 run full-precision SDPA."]
    lines += [f"{plans.SM90_KERNEL_ENV}={plans.sm90_kernel_wanted()}: on sm90, 'auto' (default) runs the "
              "warp-specialized Gluon kernel where it measured faster (FP8 PV, head dim 128; calls without "
              "causal/mask/LSE), 'triton' the plain-Triton kernel everywhere, 'gluon' the Gluon kernel "
              "wherever it runs (FP8 PV)."]
    return lines
