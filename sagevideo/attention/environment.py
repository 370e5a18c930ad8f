"""What runs where on this machine, as `sagevideo env` prints it: the devices, each registered
attention backend (available on each device, or why not) and which kernel and plan
sageattn(backend="auto") runs there (`kernels.dispatch.kernel_for`), and why."""

from __future__ import annotations

import platform
import textwrap
from dataclasses import dataclass

import torch

from sagevideo.attention import backends
from sagevideo.kernels import plans
from sagevideo.kernels.dispatch import kernel_for


@dataclass(frozen=True)
class PlanRow:
    device: str
    head_dim: int
    pv: str
    runs: str  # "triton", "gluon" (warp-specialized sm90 kernel) or "sdpa (fallback)"
    detail: str  # the plan, or why the kernels cannot run


@dataclass(frozen=True)
class BackendRow:
    backend: str
    device: str
    problem: str  # '' = available there


def devices() -> list[torch.device]:
    """The CPU, then each CUDA device."""
    found = [torch.device("cpu")]
    if torch.cuda.is_available():
        found += [torch.device("cuda", i) for i in range(torch.cuda.device_count())]
    return found


def device_name(device: torch.device) -> str:
    """'cuda:0 NAME (smXY)', or 'cpu (PROCESSOR)'."""
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        return f"{device} {torch.cuda.get_device_name(device)} (sm{major}{minor})"
    return f"{device} ({platform.processor() or platform.machine()})"


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
                choice = kernel_for(device, head_dim, pv)
                detail = choice.plan.describe() + (f"; {choice.reason}" if choice.reason else "")
                rows.append(PlanRow(str(device), head_dim, pv, choice.kernel, detail))
    return rows


def attention_lines() -> list[str]:
    """The devices, backends and kernel plans section of `sagevideo env`; ValueError for a
    misspelt SAGEVIDEO_SM90_KERNEL."""
    lines = ["devices:", *(f"  {device_name(d)}" for d in devices())]
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
    return lines
