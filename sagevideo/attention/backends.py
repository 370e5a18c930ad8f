"""The attention backend registry: which backend can compute a call, and why not.

In the manner of diffusers' `attention_dispatch.py`: one enum of backends, each registered with its
constraint checks. A check takes an `AttentionCall` (what the call is, no tensors) and returns ''
when the backend can compute it, else the reason, phrased for the user. The policy (`choose`):
- backend="auto" is not a backend: it takes the first of `AUTO_ORDER` whose checks all pass, else
  `FALLBACK` (full-precision SDPA) with the first candidate's reason, which the caller records and
  warns about once;
- an explicitly requested backend runs, or raises ValueError with its reason.

Backends:
- "triton": the quantized kernels (`torch.ops.sagevideo.sageattn_fwd`). On Hopper the plan may name
  the warp-specialized Gluon sm90 kernel (same numerics, its own op `sageattn_fwd_gluon`); a call it
  computes is recorded as "gluon", also inside torch.compile'd graphs.
- "reference": the pure-PyTorch emulation of the kernels' numerics (any device and dtype).
- "sdpa": torch's own scaled_dot_product_attention (`functional.TORCH_SDPA`, also when user code has
  replaced `torch.nn.functional`'s with sagevideo's), full precision.

Triton itself is never imported here: the checks that need it ask `sagevideo.kernels.plans`.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

import torch

from sagevideo.choices import BACKENDS
from sagevideo.kernels import plans


class Backend(str, enum.Enum):
    """A backend that computes attention (the value is the `backend=` name and the recorded name)."""

    TRITON = "triton"
    REFERENCE = "reference"
    SDPA = "sdpa"


AUTO = "auto"
CHOICES = BACKENDS  # what `backend=` accepts: "auto" and each Backend
KERNEL_DTYPES = (torch.float16, torch.bfloat16)
GLUON = "gluon"  # recorded instead of "triton" when the Gluon sm90 kernel computed the call
DEVICE_KERNELS = plans.DEVICE_KERNELS  # the kernels' function names, as a profiler lists them


@dataclass(frozen=True)
class AttentionCall:
    """What the constraint checks look at: one attention call, described without its tensors.

    device, dtype: the inputs'. head_dim: q's last dim. pv: "fp16" or "fp8" (resolved, not "auto").
    rotate_qk: Q and K rotated before quantization (16-bit tensor-core dots).
    mask_dtype, mask_shape: attn_mask's dtype and shape as given (None: no mask); n_k: keys.
    dropout_p: SDPA's dropout. shape_problem: why SDPA-signature inputs do not reduce to the kernels'
    rank-4 (B, H, N, D) call (shapes, dtypes, a scale that is not finite; set by
    `scaled_dot_product_attention`), or ''.
    """

    device: torch.device
    dtype: torch.dtype
    head_dim: int
    pv: str = "fp16"
    rotate_qk: bool = True
    mask_dtype: torch.dtype | None = None
    mask_shape: tuple[int, ...] | None = None
    n_k: int = 0
    dropout_p: float = 0.0
    shape_problem: str = ""


Check = Callable[[AttentionCall], str]


@dataclass(frozen=True)
class Constraint:
    """One named constraint check: `check(call)` is '' when it holds, else the reason."""

    name: str
    check: Check


@dataclass(frozen=True)
class BackendSpec:
    """A registered backend: what it is, and the constraints a call must meet, checked in order."""

    backend: Backend
    summary: str
    constraints: tuple[Constraint, ...]

    def problem(self, call: AttentionCall) -> str:
        """'' when every constraint holds, else the first one's reason."""
        for constraint in self.constraints:
            reason = constraint.check(call)
            if reason:
                return reason
        return ""


def _sdpa_semantics(call: AttentionCall) -> str:
    if call.dropout_p:
        return f"dropout_p={call.dropout_p}: the kernels compute no dropout"
    return call.shape_problem


def _key_padding_mask(call: AttentionCall) -> str:
    if call.mask_dtype is None or call.mask_shape is None:
        return ""
    if call.mask_dtype != torch.bool:
        return f"attn_mask of dtype {call.mask_dtype}: only boolean key-padding masks run in the kernels"
    shape = (1,) * (4 - len(call.mask_shape)) + tuple(call.mask_shape)
    if shape[1] != 1 or shape[2] != 1 or shape[3] != call.n_k:
        return (f"attn_mask of shape {tuple(call.mask_shape)} is not a key-padding mask (B, 1, 1, Nk); "
                "only those run in the kernels")
    return ""


def _kernel_dtype(call: AttentionCall) -> str:
    if call.dtype not in KERNEL_DTYPES:
        return f"dtype {call.dtype}: the Triton kernels take float16 or bfloat16 inputs"
    return ""


def _head_dim(call: AttentionCall) -> str:
    return plans.head_dim_problem(call.head_dim)


def _device(call: AttentionCall) -> str:
    arch, reason = plans.arch_of(call.device)
    if arch == "sm90":
        plans.sm90_kernel_wanted()  # a misspelt SAGEVIDEO_SM90_KERNEL is an error, not a fallback
    return reason


def _pv_on_device(call: AttentionCall) -> str:
    arch, _ = plans.arch_of(call.device)
    return plans.pv_problem(arch or "", call.pv)


def _triton_installed(call: AttentionCall) -> str:
    return plans.triton_problem()


def _interpreter_bf16(call: AttentionCall) -> str:
    # Under TRITON_INTERPRET the rotation and 16-bit P·V are bf16 tl.dots for bf16 inputs.
    interpreted = call.device.type == "cpu" and plans.interpreter_enabled()
    if interpreted and call.dtype == torch.bfloat16 and (call.rotate_qk or call.pv == "fp16"):
        return ("bfloat16 under TRITON_INTERPRET: Triton's CPU interpreter computes bf16 tl.dot wrongly; "
                "use float16 inputs or backend='reference'")
    return ""


SDPA_SEMANTICS = Constraint("no dropout; SDPA-signature inputs that reduce to the kernels' (B, H, N, D) call",
                            _sdpa_semantics)
KEY_PADDING_MASK = Constraint("no mask or a boolean key-padding mask", _key_padding_mask)

_REGISTRY: dict[Backend, BackendSpec] = {
    Backend.TRITON: BackendSpec(
        Backend.TRITON,
        "INT8 Q·Kᵀ, FP16/FP8 P·V Triton kernels (the Gluon sm90 kernel where the plan names it: recorded as "
        "'gluon')",
        (
            SDPA_SEMANTICS,
            KEY_PADDING_MASK,
            Constraint("float16 or bfloat16 inputs", _kernel_dtype),
            Constraint(f"head dim <= {plans.MAX_HEAD_DIM}", _head_dim),
            Constraint("a CUDA GPU of sm80 or newer (CPU: TRITON_INTERPRET=1)", _device),
            Constraint("pv='fp8' on sm89 or newer", _pv_on_device),
            Constraint("triton installed", _triton_installed),
            Constraint("no bfloat16 tl.dot under the CPU interpreter", _interpreter_bf16),
        ),
    ),
    Backend.REFERENCE: BackendSpec(
        Backend.REFERENCE,
        "PyTorch emulation of the kernels' quantization and numerics (any device and dtype; slow)",
        (SDPA_SEMANTICS, KEY_PADDING_MASK),
    ),
    Backend.SDPA: BackendSpec(Backend.SDPA, "torch's scaled_dot_product_attention, full precision", ()),
}

AUTO_ORDER = (Backend.TRITON,)  # backend="auto" tries these in order
FALLBACK = Backend.SDPA  # and runs this, with the first candidate's reason, when none can


def registered() -> tuple[BackendSpec, ...]:
    """Every backend's spec, in enum order."""
    return tuple(_REGISTRY[backend] for backend in Backend)


def spec(backend: Backend | str) -> BackendSpec:
    return _REGISTRY[Backend(backend)]


def problem(backend: Backend | str, call: AttentionCall) -> str:
    """'' when `backend` can compute `call`, else why not."""
    return spec(backend).problem(call)


def choose(requested: str, call: AttentionCall) -> tuple[Backend, str]:
    """(backend that computes `call`, fallback reason or '') for `backend=requested` ("auto" or a
    `Backend` name, already validated). An explicit backend that cannot run raises ValueError."""
    if requested == AUTO:
        first_reason = ""
        for backend in AUTO_ORDER:
            reason = problem(backend, call)
            if not reason:
                return backend, ""
            first_reason = first_reason or reason
        return FALLBACK, first_reason
    reason = problem(requested, call)
    if reason:
        raise ValueError(f"sageattn: backend={requested!r} cannot run: {reason}. "
                         "Use backend='auto' to fall back to SDPA.")
    return Backend(requested), ""
