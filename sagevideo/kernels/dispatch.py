"""The kernels' one entry for a call: which attention kernel computes it, under which plan.

`plans.select_plan` gives a device's plan for a head dim and PV mode (it may name the Gluon sm90
kernel); a call the Gluon kernel does not implement (`op.gluon_runs`: causal, key mask, per-token
K scales, LSE) runs the plain-Triton kernel with the same tiles. Callers
above (`attention`, and through it `sagevideo env`) ask here instead of combining the plan rules
themselves. `select_tiles` is the device tile selection in the tiles of the plan a call would run.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sagevideo.kernels.plans import KernelPlan, plain_triton, select_plan
from sagevideo.kernels.sparse_reference import TileLists
from sagevideo.kernels.tile_select import DynamicSelection


@dataclass(frozen=True)
class KernelChoice:
    """plan: what the kernel launches with; kernel: "triton" (plain) or "gluon" (warp-specialized sm90),
    always `plan.kernel`; reason: why the plan is not the Gluon one where the device could run it ('')."""

    plan: KernelPlan
    reason: str = ""

    @property
    def kernel(self) -> str:
        return self.plan.kernel


def kernel_for(
    device: torch.device,
    head_dim: int,
    pv: str,
    *,
    is_causal: bool = False,
    has_mask: bool = False,
    per_token: bool = False,
    return_lse: bool = False,
) -> KernelChoice:
    """The kernel and plan that compute a call on `device` (its checks passed: `backends.choose` gave
    the Triton backend), dense or block-sparse (both kernels take tile lists, in the same tiles);
    ValueError naming why when the kernels have no plan there."""
    from sagevideo.kernels.op import gluon_runs

    choice = select_plan(device, head_dim, pv)
    if choice.plan is None:
        raise ValueError(f"no kernel plan for head dim {head_dim}, pv={pv} on {device}: {choice.reason}")
    if choice.plan.kernel == "gluon" and not gluon_runs(
        choice.plan, is_causal=is_causal, has_mask=has_mask, per_token=per_token, return_lse=return_lse,
    ):
        return KernelChoice(plain_triton(choice.plan), choice.reason)
    return KernelChoice(choice.plan, choice.reason)


def select_tiles(q: torch.Tensor, k: torch.Tensor, selection: DynamicSelection, *, pv: str, sm_scale: float,
                 key_mask: torch.Tensor | None = None) -> TileLists:
    """The dynamic tile selection (`tile_select_kernel.select_tiles`) of HND q (B, H, Nq, D) against
    k (B, H_kv, Nk, D) on the device, in the tiles of the plan a block-sparse call with `pv` runs
    (key_mask (B', Nk) bool, True = valid). Nothing is read back; ValueError where no plan runs."""
    from sagevideo.kernels import tile_select_kernel

    plan = kernel_for(q.device, q.shape[-1], pv, has_mask=key_mask is not None).plan
    q, k = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k))
    mask = None if key_mask is None else key_mask.to(device=q.device, dtype=torch.uint8).contiguous()
    return tile_select_kernel.select_tiles(q, k, plan, selection, sm_scale=sm_scale, key_mask=mask)
