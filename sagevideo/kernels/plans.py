"""Kernel plans: the fixed configuration the Triton path uses per (arch, head dim, PV mode).

Block sizes are part of the numerical contract: the quantization groups of Q and K are the
attention tiles (BLOCK_M query rows, BLOCK_N key rows), so the reference emulates a plan's
blocks exactly. `num_warps`/`num_stages`/`max_registers` are speed knobs, and so is
`scores_by_add`, which moves a row's exponents by at most about one integer-score unit per key tile
(far below the INT8 and e4m3 rounding; the reference does not emulate it, as it does not emulate
the GPU's approximate exp2).

`select_plan` returns a plan, or None with the reason the kernel cannot run, so that
`sageattn(backend="auto")` can fall back and say why, and `sagevideo env` can print it. It raises
only for a misspelt SAGEVIDEO_SM90_KERNEL.

Two kernels compute a plan, with the same tiles and numerics: the plain-Triton one
(`attention_fwd`, kernel="triton") everywhere, and on sm90 the warp-specialized Gluon one
(`attention_sm90`, kernel="gluon", FP8 PV only). SAGEVIDEO_SM90_KERNEL picks between them on sm90:
"auto" (default) takes the Gluon kernel where it measured faster, FP8 PV at head dim 128 (H200,
kernel alone, docs/benchmarks.md, fifth session of 2026-11-30: 1.43/1.45/1.75x cuDNN at 8k/32k/75k
tokens against 1.37/1.38/1.65x for the plain kernel in the same run); "triton" the plain kernel
everywhere; "gluon" the Gluon kernel wherever it runs (also d64, where it is slower, 1.36x
against 1.42x at the CogVideoX-2B shape: for comparisons). When this Triton lacks
the Gluon API or the kernel does not compile with it (checked once per process), the plan keeps
the plain kernel and its reason says why.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import torch

PV_MODES = ("fp16", "fp8")
MAX_HEAD_DIM = 128


@dataclass(frozen=True)
class KernelPlan:
    """One Triton configuration.

    arch: "sm90", "sm89", "sm80" or "interpreter" (TRITON_INTERPRET=1 on CPU tensors).
    block_d: head dim the kernel computes at (64 or 128); smaller dims are zero-padded in-kernel.
    block_m/block_n: query/key tile = Q/K quantization group for qk_granularity="block".
    scores_by_add: the int32 scores become fp32 by an integer add of 1.5·2^23's bits, the bias
    subtracted again inside the exponent's FMA (m' + 1.5·2^23·c, rounded once per row and tile),
    instead of an I2F per score (per-block K scales only; speed, see `_SCORES_BY_ADD`).
    max_registers: the plain kernel's register cap per thread (Triton's `maxnreg`), or None for
    ptxas's own choice; speed only: a lower cap fits more CTAs per SM.
    """

    arch: str
    block_d: int
    pv: str
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    kernel: str = "triton"
    scores_by_add: bool = False
    max_registers: int | None = None

    def describe(self) -> str:
        kernel = " kernel=gluon (warp-specialized sm90)" if self.kernel == "gluon" else ""
        add = " scores-by-add" if self.scores_by_add else ""
        regs = f" maxnreg={self.max_registers}" if self.max_registers else ""
        return (
            f"{self.arch} d{self.block_d} pv={self.pv}: BLOCK_M={self.block_m} BLOCK_N={self.block_n} "
            f"warps={self.num_warps} stages={self.num_stages}{regs}{add}{kernel}"
        )


@dataclass(frozen=True)
class PlanChoice:
    plan: KernelPlan | None
    reason: str = ""


# (PV mode, block_d) -> (BLOCK_M, BLOCK_N), identical on every arch so that results do not depend
# on the GPU model. Chosen by H200 tile sweeps (docs/benchmarks.md): FP8 PV gains 6% (d64) and 16%
# (d128) from 128-key tiles; 16-bit PV is best at 128x64 (2026-11-29). FP8 PV at d64 went from
# 128x128 to 64x128 when P's keys took the MMA operand order (fifth session of 2026-11-30): the
# 64-row tile keeps the kernel at 166 registers, three CTAs per SM and no spills on Triton 3.6 (the
# 128-row one spills there), 583 TOPS against 552 for the old plan at the CogVideoX-2B shape;
# 64-row Q quantization groups are finer, so no less accurate.
_TILES = {
    ("fp16", 64): (128, 64),
    ("fp16", 128): (128, 64),
    ("fp8", 64): (64, 128),
    ("fp8", 128): (64, 128),
}

# (arch, block_d) -> (num_warps, num_stages); speed only.
_LAUNCH = {
    ("sm90", 64): (4, 3),
    ("sm90", 128): (4, 3),  # H200 sweep 2026-11-29: 4 warps beat 8 by 1.0-1.7x (docs/benchmarks.md)
    ("sm89", 64): (4, 2),
    ("sm89", 128): (8, 2),
    ("sm80", 64): (4, 3),
    ("sm80", 128): (8, 2),
    ("interpreter", 64): (4, 1),
    ("interpreter", 128): (4, 1),
}
# (arch, block_d, PV mode) -> (num_warps, num_stages) where one PV mode measured better than the
# (arch, block_d) entry: 16-bit PV at d64 on the H200, 8 warps 483 TOPS vs 4 warps 431 (kernel alone,
# 2B shape, after the integer row max; docs/results/2026-11-30-h200-intmax-sweep-2b.json).
_LAUNCH_PV = {
    ("sm90", 64, "fp16"): (8, 3),
    ("sm90", 64, "fp8"): (4, 2),  # with the 128-register cap below
}
# (arch, block_d, PV mode) -> the plain kernel's register cap (Triton's maxnreg); speed only. FP8 PV
# at d64 on the H200: ptxas takes 166 registers uncapped (three CTAs per SM); capped at 128 the main
# loop has no spills (482 instructions instead of 484 with 2 stages; the masked last tile's loop
# reloads 4 values) and four CTAs fit. Kernel alone, 5 round-robin
# runs (docs/results/2026-11-30-h200-maxnreg-ab.json): 579/590 TOPS -> 596/599 with 2 stages at the
# CogVideoX-2B/5B shapes (581/582 with 3 stages); 96 registers spill 168 B.
_MAX_REGISTERS = {
    ("sm90", 64, "fp8"): 128,
}


# (arch, block_d, PV mode, kernel) whose kernel converts scores by an integer add (`scores_by_add`).
# H200, kernel alone (docs/benchmarks.md, sixth session): FP8 PV d64 plain 577/579 -> 588/588 TOPS at
# the CogVideoX-2B/5B shapes (sweep, docs/results/2026-11-30-h200-scores-by-add-bench.json); the
# Gluon d128 kernel slower with it (1.492 -> 1.465x cuDNN at 8k, 1.482 -> 1.461x at 32k, 7
# round-robin runs), the plain d128 one (not used on sm90) inconclusive (+2% in the sweep, -5% in two
# exploratory A/Bs). Elsewhere unmeasured, so I2F stays.
_SCORES_BY_ADD = {
    ("sm90", 64, "fp8", "triton"),
}


def scores_by_add(arch: str, block_d: int, pv: str, kernel: str) -> bool:
    """Whether the plan's kernel converts scores by an integer add; speed only."""
    return (arch, block_d, pv, kernel) in _SCORES_BY_ADD


def launch(arch: str, block_d: int, pv: str) -> tuple[int, int]:
    """(num_warps, num_stages) of the plain-Triton kernel; speed only."""
    return _LAUNCH_PV.get((arch, block_d, pv), _LAUNCH[(arch, block_d)])


def max_registers(arch: str, block_d: int, pv: str) -> int | None:
    """The plain-Triton kernel's register cap per thread, or None (ptxas decides); speed only."""
    return _MAX_REGISTERS.get((arch, block_d, pv))


SM90_KERNEL_ENV = "SAGEVIDEO_SM90_KERNEL"
SM90_KERNELS = ("auto", "triton", "gluon")
# Ring stages of the Gluon kernel per head dim (one consumer warpgroup per CTA; H200 sweep), and the
# (PV mode, head dim) where it measured faster than the plain-Triton kernel: what "auto" takes.
_GLUON_STAGES = {64: 2, 128: 2}
_GLUON_FASTER = {("fp8", 128)}


def sm90_kernel_wanted() -> str:
    """SAGEVIDEO_SM90_KERNEL: "auto" (default), "triton" or "gluon"."""
    value = os.environ.get(SM90_KERNEL_ENV, "auto").strip().lower() or "auto"
    if value not in SM90_KERNELS:
        raise ValueError(f"{SM90_KERNEL_ENV}={value!r}: use one of {SM90_KERNELS} (or leave it unset)")
    return value


def gluon_sm90_problem() -> str:
    """'' when this Triton has what the Gluon sm90 kernel uses, else why not."""
    try:
        from triton.experimental.gluon import language as gl
        from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma  # noqa: F401
        from triton.experimental.gluon.nvidia.hopper import TensorDescriptor  # noqa: F401
    except ImportError as exc:
        return f"this Triton has no Gluon Hopper API ({exc})"
    if not hasattr(gl, "warp_specialize"):
        return "this Triton's Gluon has no warp_specialize"
    return ""


@functools.cache
def gluon_sm90_compile_problem(block_d: int, num_stages: int) -> str:
    """'' when the Gluon kernel compiles for sm90 with this Triton (checked once per process and
    configuration, a few seconds), else the error: the plan then keeps the plain-Triton kernel and
    says why, instead of the first attention call failing."""
    try:
        from sagevideo.kernels.attention_sm90 import compile_for_sm90

        for out_dtype in ("bf16", "fp16"):  # the output's dtype is the inputs'
            compile_for_sm90(block_d, num_stages=num_stages, consumers=1, pipeline_qk=False, out_dtype=out_dtype)
    except Exception as exc:  # whatever breaks, the plain kernel computes the same numbers
        import triton

        first = (str(exc).strip().splitlines() or [""])[-1][:200]
        return f"the Gluon kernel does not compile with triton {triton.__version__} ({type(exc).__name__}: {first})"
    return ""


def padded_head_dim(head_dim: int) -> int | None:
    """Head dim the kernel runs at, or None when above MAX_HEAD_DIM."""
    if head_dim <= 64:
        return 64
    if head_dim <= MAX_HEAD_DIM:
        return 128
    return None


def interpreter_enabled() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def arch_of(device: torch.device) -> tuple[str | None, str]:
    """Map a device to a plan arch name, or (None, reason)."""
    if device.type == "cpu":
        if interpreter_enabled():
            return "interpreter", ""
        return None, "CPU tensors: the Triton kernels need a CUDA GPU (or TRITON_INTERPRET=1 for tests)"
    if device.type != "cuda":
        return None, f"{device.type} tensors: the Triton kernels need a CUDA GPU"
    if torch.version.hip is not None:
        return None, "ROCm is not supported by the INT8/FP8 Triton kernels yet"
    major, minor = torch.cuda.get_device_capability(device)
    if major >= 9:
        return "sm90", ""
    if (major, minor) >= (8, 9):
        return "sm89", ""
    if major == 8:
        return "sm80", ""
    return None, f"compute capability {major}.{minor}: the kernels need sm80 or newer (INT8 tensor cores)"


def select_plan(device: torch.device, head_dim: int, pv: str) -> PlanChoice:
    """The plan for `device`, `head_dim` and PV mode, or None with the reason."""
    if pv not in PV_MODES:
        return PlanChoice(None, f"pv={pv!r} is not one of {PV_MODES}")
    block_d = padded_head_dim(head_dim)
    if block_d is None:
        return PlanChoice(None, f"head dim {head_dim} > {MAX_HEAD_DIM}: not supported by the kernels")
    arch, reason = arch_of(device)
    if arch is None:
        return PlanChoice(None, reason)
    if pv == "fp8" and arch == "sm80":
        return PlanChoice(None, "pv='fp8' needs FP8 tensor cores (sm89 or newer); use pv='fp16'")
    block_m, block_n = _TILES[(pv, block_d)]
    num_warps, num_stages = launch(arch, block_d, pv)
    plan = KernelPlan(arch, block_d, pv, block_m, block_n, num_warps, num_stages,
                      scores_by_add=scores_by_add(arch, block_d, pv, "triton"),
                      max_registers=max_registers(arch, block_d, pv))
    wanted = sm90_kernel_wanted() if arch == "sm90" else "triton"  # checked on sm90 whatever the shape
    # Newer GPUs run the sm90 plans too, but the Gluon kernel's warpgroup MMAs exist only on Hopper.
    hopper = arch == "sm90" and torch.cuda.get_device_capability(device)[0] == 9
    if hopper and pv == "fp8" and (wanted == "gluon" or (wanted == "auto" and (pv, block_d) in _GLUON_FASTER)):
        stages = _GLUON_STAGES[block_d]
        problem = gluon_sm90_problem() or gluon_sm90_compile_problem(block_d, stages)
        if problem:  # the plain-Triton kernel computes the same; say why in `sagevideo env`
            return PlanChoice(plan, f"Gluon sm90 kernel not used ({SM90_KERNEL_ENV}={wanted}): {problem}")
        plan = KernelPlan(arch, block_d, pv, block_m, block_n, 4, stages, kernel="gluon",
                          scores_by_add=scores_by_add(arch, block_d, pv, "gluon"))
    return PlanChoice(plan)


def plain_triton(plan: KernelPlan) -> KernelPlan:
    """The plain-Triton plan with `plan`'s tiles (for calls the Gluon kernel does not take)."""
    num_warps, num_stages = launch(plan.arch, plan.block_d, plan.pv)
    return KernelPlan(plan.arch, plan.block_d, plan.pv, plan.block_m, plan.block_n, num_warps, num_stages,
                      scores_by_add=scores_by_add(plan.arch, plan.block_d, plan.pv, "triton"),
                      max_registers=max_registers(plan.arch, plan.block_d, plan.pv))


def tiles(pv: str, head_dim: int) -> tuple[int, int]:
    """(BLOCK_M, BLOCK_N) for a PV mode and head dim: what the reference must emulate.
    Head dims above 128 (reference/simulation only) use the d128 tiles."""
    if pv not in PV_MODES:
        raise ValueError(f"pv={pv!r} is not one of {PV_MODES}")
    return _TILES[(pv, padded_head_dim(head_dim) or MAX_HEAD_DIM)]
