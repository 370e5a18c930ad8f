"""Kernel plans: the only tuning knobs of the Triton path, as tables per (arch, head dim, PV mode).

Two plans per call:
- `KernelPlan`, the attention kernel's configuration. Block sizes are part of the numerical
  contract: the quantization groups of Q and K are the attention tiles (BLOCK_M query rows, BLOCK_N
  key rows), so the reference emulates a plan's blocks exactly. `num_warps`/`num_stages`/
  `max_registers` are speed knobs, and so is `scores_by_add`, which moves a row's exponents by at
  most about one integer-score unit per key tile (far below the INT8 and e4m3 rounding; the
  reference does not emulate it, as it does not emulate the GPU's approximate exp2).
- `PrepPlan`, the preparation kernels' launch shape (`prep_plan(kernel_plan)`): speed only, but for
  the K/V-stats split, which sets mean(K)'s fp32 summation order (its last bits).

`select_plan` returns a plan, or None with the reason the kernels cannot run, so that
`sageattn(backend="auto")` can fall back and say why, and `sagevideo env` can print it. It raises
only for a misspelt SAGEVIDEO_SM90_KERNEL. Its parts (`head_dim_problem`, `arch_of`, `pv_problem`,
`triton_problem`) are the attention backend registry's constraint checks.

Two kernels compute a plan, with the same tiles and numerics: the plain-Triton one
(`attention_fwd`, kernel="triton") everywhere, and on Hopper the warp-specialized Gluon one
(`attention_sm90`, kernel="gluon", FP8 PV only). SAGEVIDEO_SM90_KERNEL picks between them on sm90:
"auto" (default) takes the Gluon kernel where it measured faster, FP8 PV at head dim 128
(docs/benchmarks-history.md, "P in the MMA operand's key order"); "triton" the plain kernel everywhere;
"gluon" the Gluon kernel wherever it runs (also d64, where it is slower: for comparisons). When
this Triton lacks the Gluon API or the kernel does not compile with it (checked once per process),
the plan keeps the plain kernel and its reason says why.

Importable without triton (only the Gluon checks import it, when asked).
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import torch

from sagevideo.kernels.compile_constant import constant_under_compile

PV_MODES = ("fp16", "fp8")
MAX_HEAD_DIM = 128
KERNELS = ("triton", "gluon")
# The device kernels' function names (attention and its preparation), for profilers that attribute
# kernel time by name (`sagevideo profile` under torch.compile, where no sagevideo op surrounds them).
DEVICE_KERNELS = ("_attn_fwd_kernel", "_attn_fwd_sm90_kernel", "_kv_stats_kernel", "_kv_stats_finalize_kernel",
                  "_quantize_kv_kernel", "_quantize_q_kernel", "_tile_scores_kernel", "_select_tiles_kernel",
                  "_probe_lse_kernel")


@dataclass(frozen=True)
class KernelPlan:
    """One attention-kernel configuration.

    arch: "sm90", "sm89", "sm80" or "interpreter" (TRITON_INTERPRET=1 on CPU tensors).
    block_d: head dim the kernel computes at (64 or 128); smaller dims are zero-padded in-kernel.
    block_m/block_n: query/key tile = Q/K quantization group for qk_granularity="block".
    kernel: "triton" (plain) or "gluon" (warp-specialized sm90; FP8 PV, its num_stages = ring stages).
    scores_by_add (plain kernel): the int32 scores become fp32 by an integer add of 1.5·2^23's bits,
    the bias subtracted again inside the exponent's FMA (m' + 1.5·2^23·c, rounded once per row and
    tile), instead of an I2F per score (per-block K scales only; speed, see `_SCORES_BY_ADD`).
    max_registers (plain kernel): its register cap per thread (Triton's `maxnreg`), or None for
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

    def __post_init__(self) -> None:
        if self.kernel not in KERNELS:
            raise ValueError(f"KernelPlan: kernel={self.kernel!r} is not one of {KERNELS}")
        if self.kernel == "gluon" and (self.pv != "fp8" or self.scores_by_add or self.max_registers):
            raise ValueError("KernelPlan: the Gluon sm90 kernel runs FP8 PV with its own launch "
                             "(no scores_by_add, no max_registers)")

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


@dataclass(frozen=True)
class PrepPlan:
    """Launch shape of the preparation kernels (`quantize.quantize_inputs`) for one KernelPlan.

    stats_min_tokens/stats_chunk/stats_warps: the K/V-stats programs take splits of at least
    stats_min_tokens keys (at most max_splits per head), read in stats_chunk-row chunks by
    stats_warps warps; the split sets mean(K)'s fp32 summation order (its last bits), nothing else.
    finalize_chunk: splits the finalize program reduces per step.
    kv_warps/q_warps: warps of the K/V and Q quantization programs.
    kv_tiles_per_program/q_tiles_per_program: the most K/V (BLOCK_N) and Q (BLOCK_M) tiles one
    program quantizes (the rotation and per-head vectors loaded once), fewer where a head would get
    under min_programs_per_head programs (short sequences still fill the GPU). The groups
    themselves are the KernelPlan's tiles: these change no result.
    """

    stats_min_tokens: int
    stats_chunk: int
    stats_warps: int
    kv_warps: int
    q_warps: int
    max_splits: int = 128
    finalize_chunk: int = 32
    kv_tiles_per_program: int = 1
    q_tiles_per_program: int = 4
    min_programs_per_head: int = 16

    def tiles_per_program(self, n_tiles: int, most: int) -> int:
        """Tiles per program for a head of `n_tiles` tiles: up to `most`, keeping at least
        `min_programs_per_head` programs."""
        return max(1, min(most, n_tiles // self.min_programs_per_head))

    def most_q_tiles(self, pool: bool) -> int:
        """The most Q tiles one program quantizes: one when it also pools them for the tile selection.
        Looping over several, the Gram pooling under the rotation compiled for sm_90 gave wrong
        similarities on every tile after a program's first (docs/sparse.md, "The Q pooling's sums on
        the tensor cores"); a program per tile costs ~0.03 ms at Wan 720p."""
        return 1 if pool else self.q_tiles_per_program


# (PV mode, block_d) -> (BLOCK_M, BLOCK_N), identical on every arch so that results do not depend
# on the GPU model. From the H200 tile sweeps (docs/benchmarks-history.md, "Tile sweep" and "P in the MMA
# operand's key order"): FP8 PV is fastest with 128-key tiles; 16-bit PV at 128x64. FP8 PV at d64
# takes 64-row tiles with P in the MMA operand's key order: the kernel stays at three CTAs per SM
# without spills (128 rows spill on Triton 3.6); 64-row Q quantization groups are finer, so no less
# accurate.
_TILES = {
    ("fp16", 64): (128, 64),
    ("fp16", 128): (128, 64),
    ("fp8", 64): (64, 128),
    ("fp8", 128): (64, 128),
}

# (arch, block_d) -> (num_warps, num_stages) of the plain kernel; speed only. sm90 from the H200
# sweeps (4 warps beat 8 at d128); sm89/sm80 unmeasured.
_LAUNCH = {
    ("sm90", 64): (4, 3),
    ("sm90", 128): (4, 3),
    ("sm89", 64): (4, 2),
    ("sm89", 128): (8, 2),
    ("sm80", 64): (4, 3),
    ("sm80", 128): (8, 2),
    ("interpreter", 64): (4, 1),
    ("interpreter", 128): (4, 1),
}
# (arch, block_d, PV mode) -> (num_warps, num_stages) where one PV mode measured better than the
# (arch, block_d) entry: 16-bit PV at d64 on the H200, 8 warps (483 TOPS against 431 with 4, the
# tile/launch sweep in docs/benchmarks-history.md, "the integer row max").
_LAUNCH_PV = {
    ("sm90", 64, "fp16"): (8, 3),
    ("sm90", 64, "fp8"): (4, 2),  # with the 128-register cap below
}
# (arch, block_d, PV mode) -> the plain kernel's register cap (Triton's maxnreg); speed only. FP8 PV
# at d64 on the H200: ptxas takes 166 registers uncapped (three CTAs per SM); capped at 128 the main
# loop does not spill and four CTAs fit, 2-3% faster with 2 stages (docs/benchmarks-history.md, "scores by
# an integer add, four CTAs per SM at d64"); 96 registers spill.
_MAX_REGISTERS = {
    ("sm90", 64, "fp8"): 128,
}
# (arch, block_d, PV mode) whose plain kernel converts scores by an integer add (`scores_by_add`):
# measured faster for FP8 PV at d64 on the H200 (+2%), inconclusive for the plain d128 kernel, slower
# in the Gluon kernel, which therefore has no such path (docs/benchmarks-history.md, "scores by an integer
# add"). Elsewhere unmeasured, so I2F stays.
_SCORES_BY_ADD = {
    ("sm90", 64, "fp8"),
}

SM90_KERNEL_ENV = "SAGEVIDEO_SM90_KERNEL"
SM90_KERNELS = ("auto", "triton", "gluon")
# Ring stages of the Gluon kernel per head dim (2 measured fastest on the H200), and the (PV mode, head
# dim) where it measured faster than the plain-Triton kernel: what "auto" takes.
_GLUON_STAGES = {64: 2, 128: 2}
_GLUON_FASTER = {("fp8", 128)}

# (block_d, FP8 V) -> (stats_min_tokens, stats_chunk, stats_warps). H200 sweep of
# `bench/bench_prep.py --stats` (docs/benchmarks-history.md, "a division-free preparation"): 64-row chunks
# of 256-token splits when both K and V are read at d128, else 32-row chunks of 512 tokens.
_STATS_SHAPE = {
    (64, False): (512, 32, 4),
    (64, True): (512, 32, 4),
    (128, False): (512, 32, 4),
    (128, True): (256, 64, 4),
}


def scores_by_add(arch: str, block_d: int, pv: str) -> bool:
    """Whether the plain kernel's plan converts scores by an integer add; speed only."""
    return (arch, block_d, pv) in _SCORES_BY_ADD


def launch(arch: str, block_d: int, pv: str) -> tuple[int, int]:
    """(num_warps, num_stages) of the plain-Triton kernel; speed only."""
    return _LAUNCH_PV.get((arch, block_d, pv), _LAUNCH[(arch, block_d)])


def max_registers(arch: str, block_d: int, pv: str) -> int | None:
    """The plain-Triton kernel's register cap per thread, or None (ptxas decides); speed only."""
    return _MAX_REGISTERS.get((arch, block_d, pv))


def gluon_stages(block_d: int) -> int:
    """K/V ring stages of the Gluon sm90 kernel at `block_d`."""
    return _GLUON_STAGES[block_d]


# Warps of the K/V and Q quantization programs, every tile; speed only. 4 on the H100 at Wan 720p,
# CogVideoX-5B and d128-8k, both PV modes, with and without the selection's pooling: equal or faster
# than 8 everywhere, by 25 % on FP8 K/V tiles of 128x128 and 10-35 % with pooling
# (`python -m bench.bench_prep --shapes wan-720p,cogvideox-5b,d128-8k --warps auto,4 --pool off,on`,
# docs/sparse.md); an earlier H200 sweep had 8 equal or better on tiles above 64x64.
QUANT_WARPS = 4


def prep_plan(plan: KernelPlan) -> PrepPlan:
    """The preparation kernels' launch shape for `plan` (its tiles and PV mode decide it)."""
    min_tokens, chunk, warps = _STATS_SHAPE[(plan.block_d, plan.pv == "fp8")]
    return PrepPlan(stats_min_tokens=min_tokens, stats_chunk=chunk, stats_warps=warps,
                    kv_warps=QUANT_WARPS, q_warps=QUANT_WARPS)


def sm90_kernel_wanted() -> str:
    """SAGEVIDEO_SM90_KERNEL: "auto" (default), "triton" or "gluon"."""
    value = os.environ.get(SM90_KERNEL_ENV, "auto").strip().lower() or "auto"
    if value not in SM90_KERNELS:
        raise ValueError(f"{SM90_KERNEL_ENV}={value!r}: use one of {SM90_KERNELS} (or leave it unset)")
    return value


def triton_problem() -> str:
    """'' when triton imports, else why the Triton kernels cannot run."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return "triton is not installed"
    return ""


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
            compile_for_sm90(block_d, num_stages=num_stages, out_dtype=out_dtype)
    except Exception as exc:  # whatever breaks, the plain kernel computes the same numbers
        import triton

        first = (str(exc).strip().splitlines() or [""])[-1][:200]
        return f"the Gluon kernel does not compile with triton {triton.__version__} ({type(exc).__name__}: {first})"
    return ""


@constant_under_compile
def gluon_problem(block_d: int, num_stages: int) -> str:
    """'' when the Gluon sm90 kernel can run at `block_d` with `num_stages` ring stages (this Triton
    has its API and compiles it), else why not: `gluon_sm90_problem`, then
    `gluon_sm90_compile_problem`.

    Opaque to torch.compile: Dynamo calls it while tracing and keeps the answer as a constant (it is
    constant for the process). Traced into, the compile check (Dynamo traces through
    `functools.cache`) graph-broke inside every `sageattn` call that asked for it (FP8 PV on Hopper),
    and failed `fullgraph=True`."""
    return gluon_sm90_problem() or gluon_sm90_compile_problem(block_d, num_stages)


def padded_head_dim(head_dim: int) -> int | None:
    """Head dim the kernel runs at, or None when above MAX_HEAD_DIM."""
    if head_dim <= 64:
        return 64
    if head_dim <= MAX_HEAD_DIM:
        return 128
    return None


def head_dim_problem(head_dim: int) -> str:
    """'' when the kernels take `head_dim` (zero-padded to 64 or 128), else why not."""
    if padded_head_dim(head_dim) is None:
        return f"head dim {head_dim} > {MAX_HEAD_DIM}: not supported by the kernels"
    return ""


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


def pv_problem(arch: str, pv: str) -> str:
    """'' when `arch` runs PV mode `pv`, else why not."""
    if pv not in PV_MODES:
        return f"pv={pv!r} is not one of {PV_MODES}"
    if pv == "fp8" and arch == "sm80":
        return "pv='fp8' needs FP8 tensor cores (sm89 or newer); use pv='fp16'"
    return ""


def select_plan(device: torch.device, head_dim: int, pv: str) -> PlanChoice:
    """The plan for `device`, `head_dim` and PV mode, or None with the reason."""
    if pv not in PV_MODES:
        return PlanChoice(None, pv_problem("", pv))
    problem = head_dim_problem(head_dim)
    if problem:
        return PlanChoice(None, problem)
    arch, reason = arch_of(device)
    if arch is None:
        return PlanChoice(None, reason)
    problem = pv_problem(arch, pv)
    if problem:
        return PlanChoice(None, problem)
    block_d = padded_head_dim(head_dim)
    block_m, block_n = _TILES[(pv, block_d)]
    plan = plain_plan(arch, block_d, pv, block_m, block_n)
    wanted = sm90_kernel_wanted() if arch == "sm90" else "triton"  # checked on sm90 whatever the shape
    # Newer GPUs run the sm90 plans too, but the Gluon kernel's warpgroup MMAs exist only on Hopper.
    hopper = arch == "sm90" and torch.cuda.get_device_capability(device)[0] == 9
    if hopper and pv == "fp8" and (wanted == "gluon" or (wanted == "auto" and (pv, block_d) in _GLUON_FASTER)):
        stages = gluon_stages(block_d)
        problem = gluon_problem(block_d, stages)
        if problem:  # the plain-Triton kernel computes the same; say why in `sagevideo env`
            return PlanChoice(plan, f"Gluon sm90 kernel not used ({SM90_KERNEL_ENV}={wanted}): {problem}")
        plan = KernelPlan(arch, block_d, pv, block_m, block_n, 4, stages, kernel="gluon")
    return PlanChoice(plan)


def plain_plan(arch: str, block_d: int, pv: str, block_m: int, block_n: int) -> KernelPlan:
    """The plain-Triton kernel's plan for these tiles: its launch, register cap and score conversion."""
    num_warps, num_stages = launch(arch, block_d, pv)
    return KernelPlan(arch, block_d, pv, block_m, block_n, num_warps, num_stages,
                      scores_by_add=scores_by_add(arch, block_d, pv), max_registers=max_registers(arch, block_d, pv))


def plain_triton(plan: KernelPlan) -> KernelPlan:
    """The plain-Triton plan with `plan`'s tiles (for calls the Gluon kernel does not take)."""
    return plain_plan(plan.arch, plan.block_d, plan.pv, plan.block_m, plan.block_n)


def tiles(pv: str, head_dim: int) -> tuple[int, int]:
    """(BLOCK_M, BLOCK_N) for a PV mode and head dim: what the reference must emulate.
    Head dims above 128 (reference/simulation only) use the d128 tiles."""
    if pv not in PV_MODES:
        raise ValueError(f"pv={pv!r} is not one of {PV_MODES}")
    return _TILES[(pv, padded_head_dim(head_dim) or MAX_HEAD_DIM)]
