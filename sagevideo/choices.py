"""The choices users name (attention, backend, P·V precision, Q/K granularity, device, dtype,
the recipe's compile/linear/cache),
declared once, and the two rules that resolve "auto": the device, and FP8 P·V on sm89+.

Job specs, the generation config, the CLI (typer reads these Literals), the attention op and the
pipelines all take their values from here. This module imports nothing of sagevideo and torch
only inside the two rules, so every room can use it.
"""

from __future__ import annotations

from typing import Any, Literal, get_args

Attention = Literal["sage", "full"]  # sage: sagevideo's quantized attention; full: the stock processor
Backend = Literal["auto", "triton", "reference", "sdpa"]  # what `sageattn(backend=...)` may be asked for
# What the INT8 contract's run-time guard does with a layer past INT8's accuracy (`pipelines.guard`)
AttentionGuard = Literal["warn", "full", "fail"]
PV = Literal["fp16", "fp8"]  # the P·V product's precision
PVChoice = Literal["auto", "fp16", "fp8"]  # auto: `auto_pv(device)`
Granularity = Literal["block", "token"]  # Q/K quantization scales per tile or per token
Device = Literal["auto", "cpu", "cuda"]  # auto: `resolve_device`
DType = Literal["float32", "bfloat16", "float16"]
# The speed recipe around attention (`sagevideo.jobs.recipe.Recipe`): regional torch.compile,
# the transformer blocks' linears in FP8 (torchao), and diffusers' step-caching hooks.
Compile = Literal["none", "regional"]  # regional: each transformer block compiled on its own
CompileBackend = Literal["inductor", "aot_eager", "eager"]  # torch.compile backends (eager: Dynamo only)
Linear = Literal["bf16", "fp8"]  # fp8: torchao float8 dynamic activation + weight, rowwise scales
Cache = Literal["none", "first-block", "taylorseer", "pyramid-broadcast"]  # diffusers.hooks cache configs
# Block-sparse attention's tile selection (docs/sparse.md): dynamic from pooled Q/K scores, static from
# 3-D windows on the latent grid; written METHOD:DENSITY ("dynamic:0.15"), or "off".
SparseMethod = Literal["dynamic", "static"]

ATTENTIONS: tuple[str, ...] = get_args(Attention)
BACKENDS: tuple[str, ...] = get_args(Backend)
PVS: tuple[str, ...] = get_args(PV)
PV_CHOICES: tuple[str, ...] = get_args(PVChoice)
GRANULARITIES: tuple[str, ...] = get_args(Granularity)
DEVICES: tuple[str, ...] = get_args(Device)
DTYPES: tuple[str, ...] = get_args(DType)
COMPILES: tuple[str, ...] = get_args(Compile)
COMPILE_BACKENDS: tuple[str, ...] = get_args(CompileBackend)
LINEARS: tuple[str, ...] = get_args(Linear)
CACHES: tuple[str, ...] = get_args(Cache)
SPARSE_METHODS: tuple[str, ...] = get_args(SparseMethod)
SPARSE_OFF = "off"

FP8_CAPABILITY = (8, 9)  # Ada and newer NVIDIA GPUs have FP8 tensor cores


def has_fp8_tensor_cores(device: Any = "cuda") -> bool:
    """Whether `device` (a torch.device or "cuda"/"cuda:N"/"cpu") is an NVIDIA GPU with FP8 tensor
    cores (compute capability 8.9 or newer); never True for CPUs or ROCm."""
    import torch

    device = torch.device(device)
    if device.type != "cuda" or torch.version.hip is not None:
        return False
    return tuple(torch.cuda.get_device_capability(device)) >= FP8_CAPABILITY


def auto_pv(device: Any = "cuda") -> str:
    """The P·V precision "auto" means on `device`: "fp8" where FP8 tensor cores exist (the fastest
    mode, within its accuracy contract), "fp16" elsewhere."""
    return "fp8" if has_fp8_tensor_cores(device) else "fp16"


def resolve_pv(pv: str, device: Any) -> str:
    """pv "auto" -> `auto_pv(device)`; "fp16"/"fp8" stay as given."""
    return auto_pv(device) if pv == "auto" else pv


def resolve_device(device: str) -> str:
    """device "auto" -> "cuda" when torch sees a GPU, else "cpu"; any other device stays as given."""
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def parse_sparse(text: str) -> tuple[str, float, int | None] | None:
    """A block-sparse setting's text form -> (method, density, reuse steps or None), or None for "off":
    METHOD:DENSITY[:reuseN] with METHOD one of SPARSE_METHODS, DENSITY in (0, 1] (kept / all key
    tiles) and, for dynamic selection, N >= 1 the steps one selection serves (1, or none given:
    select at every step), e.g. "dynamic:0.15", "dynamic:0.15:reuse2". ValueError naming the bad part
    and the fix."""
    fix = f"give METHOD:DENSITY with METHOD {' or '.join(SPARSE_METHODS)} and DENSITY in (0, 1], e.g. dynamic:0.15 " \
          f"(dynamic:0.15:reuse2 selects every other step), or {SPARSE_OFF}"
    if not isinstance(text, str):
        raise ValueError(f"{text!r} is not a sparse setting; {fix}")
    value = text.strip().lower()
    if value == SPARSE_OFF:
        return None
    method, sep, rest = value.partition(":")
    if not sep or method not in SPARSE_METHODS:
        raise ValueError(f"{text!r}: unknown method {method!r}; {fix}" if sep else f"{text!r}: {fix}")
    density_text, _, reuse_text = rest.partition(":")
    try:
        density = float(density_text)
    except ValueError:
        raise ValueError(f"{text!r}: density {density_text!r} is not a number; {fix}") from None
    if not 0 < density <= 1:  # also NaN
        raise ValueError(f"{text!r}: density {density_text} is outside (0, 1] (kept / all key tiles); {fix}")
    if not reuse_text:
        return method, density, None
    steps = reuse_text.removeprefix("reuse")
    if not reuse_text.startswith("reuse") or not steps.isdigit() or int(steps) < 1:
        raise ValueError(f"{text!r}: {reuse_text!r} is not reuseN with N >= 1 (the steps one selection serves); {fix}")
    if method != "dynamic":
        raise ValueError(f"{text!r}: only dynamic selection reuses its tiles over steps (static windows depend on no "
                         f"input); remove :{reuse_text} or give dynamic:{density_text}")
    return method, density, None if int(steps) == 1 else int(steps)


def sparse_text(method: str, density: float, reuse_steps: int | None = None) -> str:
    """The text form `parse_sparse` reads back exactly: 'dynamic:0.15', 'dynamic:0.15:reuse2'."""
    reuse = "" if reuse_steps is None or reuse_steps == 1 else f":reuse{reuse_steps}"
    return f"{method}:{float(density)!r}{reuse}"
