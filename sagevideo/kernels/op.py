"""The op boundary: `torch.ops.sagevideo.sageattn_fwd`, a `torch.library.triton_op`.

Registering the quantize + attention launches as one triton_op lets `torch.compile(fullgraph=True)`
trace through it (and Inductor see the Triton kernels) instead of graph-breaking on Python.
`sageattn_triton` is the thin Python entry used by `sagevideo.attention.functional`.
"""

from __future__ import annotations

import torch
from torch.library import triton_op

from sagevideo.kernels.attention_fwd import attention_forward
from sagevideo.kernels.plans import KernelPlan
from sagevideo.kernels.quantize import quantize_inputs
from sagevideo.kernels.rotation import hadamard_pm1


def attention_kernel(prepared, v: torch.Tensor, key_mask: torch.Tensor | None, out: torch.Tensor,
                     lse: torch.Tensor | None, plan: KernelPlan, *, is_causal: bool, per_token: bool,
                     n_q: int, n_k: int) -> None:
    """The attention kernel `plan.kernel` names, on prepared inputs (no quantization): the plain
    Triton one, or the Gluon sm90 one (callers ensure `gluon_runs`)."""
    if plan.kernel == "gluon":
        from sagevideo.kernels.attention_sm90 import attention_forward_sm90

        attention_forward_sm90(prepared, out, block_n=plan.block_n, n_q=n_q, n_k=n_k, num_stages=plan.num_stages)
    else:
        attention_forward(prepared, v, key_mask, out, lse, plan, is_causal=is_causal, per_token=per_token,
                          n_q=n_q, n_k=n_k)


@triton_op("sagevideo::sageattn_fwd", mutates_args=())
def sageattn_fwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    key_mask: torch.Tensor | None,
    rotation: torch.Tensor | None,
    sm_scale: float,
    is_causal: bool,
    per_token: bool,
    smooth_k: bool,
    return_lse: bool,
    pv: str,
    arch: str,
    block_d: int,
    block_m: int,
    block_n: int,
    num_warps: int,
    num_stages: int,
    kernel: str,
    scores_by_add: bool,
    max_registers: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """q/k/v (B, H, N, D) views with unit head-dim stride; key_mask (B', Nk) uint8.

    Returns (out like q, lse (B, H, Nq) fp32; an empty tensor unless return_lse).
    kernel "gluon": the warp-specialized sm90 kernel (callers ensure `attention_sm90.supports`).
    The plan travels as its fields (the op schema takes no dataclass); max_registers 0 = no cap.
    """
    plan = KernelPlan(arch, block_d, pv, block_m, block_n, num_warps, num_stages, kernel, scores_by_add,
                      max_registers or None)
    batch, heads, n_q, _ = q.shape
    n_k = k.shape[2]
    prepared = quantize_inputs(
        q, k, v, key_mask, rotation, plan,
        sm_scale=sm_scale, per_token=per_token, smooth_k=smooth_k, need_shift=return_lse,
    )
    out = torch.empty_like(q)
    lse = torch.empty(batch, heads, n_q if return_lse else 0, device=q.device, dtype=torch.float32)
    attention_kernel(prepared, v, key_mask, out, lse if return_lse else None, plan,
                     is_causal=is_causal, per_token=per_token, n_q=n_q, n_k=n_k)
    return out, lse


def sageattn_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    plan: KernelPlan,
    *,
    sm_scale: float,
    is_causal: bool,
    key_mask: torch.Tensor | None,
    per_token: bool,
    smooth_k: bool,
    rotate_qk: bool,
    return_lse: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Run the Triton path on HND views; copies only tensors whose head dim is not contiguous.

    `plan.kernel` "gluon" must already be checked against the call (`gluon_runs`).
    """
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    mask = None if key_mask is None else key_mask.to(device=q.device, dtype=torch.uint8).contiguous()
    rotation = hadamard_pm1(plan.block_d, q.device, q.dtype) if rotate_qk else None
    out, lse = torch.ops.sagevideo.sageattn_fwd(
        q, k, v, mask, rotation, sm_scale, is_causal, per_token, smooth_k, return_lse,
        plan.pv, plan.arch, plan.block_d, plan.block_m, plan.block_n, plan.num_warps, plan.num_stages, plan.kernel,
        plan.scores_by_add, plan.max_registers or 0,
    )
    return out, (lse if return_lse else None)


def gluon_runs(plan: KernelPlan, *, is_causal: bool, has_mask: bool, per_token: bool, return_lse: bool) -> bool:
    """Whether the Gluon sm90 kernel computes this call under `plan` (else the plain-Triton one).

    Not while torch.compile traces: the Gluon launch is not wrapped for Inductor (`wrap_triton`).
    """
    if plan.kernel != "gluon" or torch.compiler.is_compiling():
        return False
    from sagevideo.kernels.attention_sm90 import supports

    return not supports(pv=plan.pv, is_causal=is_causal, has_mask=has_mask, per_token=per_token,
                        return_lse=return_lse)


def _fake_sageattn_fwd(q, k, v, key_mask, rotation, sm_scale, is_causal, per_token, smooth_k, return_lse,
                       pv, arch, block_d, block_m, block_n, num_warps, num_stages, kernel, scores_by_add,
                       max_registers):
    batch, heads, n_q, _ = q.shape
    lse = q.new_empty(batch, heads, n_q if return_lse else 0, dtype=torch.float32)
    return torch.empty_like(q), lse


def _register_interpreter_fake() -> None:
    """Under TRITON_INTERPRET the kernels are interpreted Python that reads data pointers, which fake
    tensors lack; give tracing an explicit fake so torch.compile tests can run on CPU."""
    from sagevideo.kernels.plans import interpreter_enabled

    if interpreter_enabled():
        sageattn_fwd.register_fake(_fake_sageattn_fwd)


_register_interpreter_fake()
