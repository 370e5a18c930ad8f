"""Error metrics between a reference attention output and a test output (SageAttention's set).

All metrics are computed in fp64 per slice (e.g. per head) so that worst cases are visible:
cosine similarity (1 is perfect), relative L1 = Σ|ref − out| / Σ|ref|, RMSE.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch


@dataclass(frozen=True)
class ErrorStats:
    """Worst and mean of each metric over slices (worst: min cosine, max rel-L1/RMSE)."""

    cos_worst: float
    cos_mean: float
    rel_l1_worst: float
    rel_l1_mean: float
    rmse_worst: float
    rmse_mean: float
    n_slices: int
    nonfinite: int

    def as_dict(self) -> dict[str, float | int]:
        return asdict(self)


def per_slice_errors(ref: torch.Tensor, out: torch.Tensor, slice_dims: int = 2) -> dict[str, torch.Tensor]:
    """Cosine / rel-L1 / RMSE per slice over the leading `slice_dims` dims (default: per (B, H)).

    ref/out: same shape, any float dtype; returns fp64 tensors of shape ref.shape[:slice_dims].
    """
    if ref.shape != out.shape:
        raise ValueError(f"shapes differ: reference {tuple(ref.shape)} vs output {tuple(out.shape)}")
    r = ref.double().flatten(slice_dims)
    o = out.double().flatten(slice_dims)
    cos = torch.nn.functional.cosine_similarity(r, o, dim=-1, eps=1e-30)
    rel_l1 = (r - o).abs().sum(-1) / r.abs().sum(-1).clamp(min=1e-30)
    rmse = (r - o).pow(2).mean(-1).sqrt()
    return {"cos": cos, "rel_l1": rel_l1, "rmse": rmse}


def error_stats(ref: torch.Tensor, out: torch.Tensor, slice_dims: int = 2) -> ErrorStats:
    """Worst and mean errors over slices; NaN/Inf in `out` are counted and make every metric worst."""
    nonfinite = int((~torch.isfinite(out)).sum().item())
    e = per_slice_errors(ref, out, slice_dims)
    cos = torch.nan_to_num(e["cos"], nan=-1.0)
    rel = torch.nan_to_num(e["rel_l1"], nan=float("inf"))
    rmse = torch.nan_to_num(e["rmse"], nan=float("inf"))
    return ErrorStats(
        cos_worst=cos.min().item(), cos_mean=cos.mean().item(),
        rel_l1_worst=rel.max().item(), rel_l1_mean=rel.mean().item(),
        rmse_worst=rmse.max().item(), rmse_mean=rmse.mean().item(),
        n_slices=cos.numel(), nonfinite=nonfinite,
    )


def attention_fp64(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    sm_scale: float | None = None,
    key_mask: torch.Tensor | None = None,
    is_causal: bool = False,
) -> torch.Tensor:
    """Exact attention in fp64 (HND), the oracle for quantization error. key_mask (B', Nk) bool."""
    scale = q.shape[-1] ** -0.5 if sm_scale is None else sm_scale
    s = (q.double() @ k.double().transpose(-1, -2)) * scale
    if key_mask is not None:
        s = s.masked_fill(~key_mask[:, None, None, :].to(s.device), float("-inf"))
    if is_causal:
        n_q, n_k = s.shape[-2:]
        s = s.masked_fill(torch.ones(n_q, n_k, dtype=torch.bool, device=s.device).triu(1), float("-inf"))
    return torch.softmax(s, dim=-1) @ v.double()


# Score standard deviation above which INT8 Q·Kᵀ alone costs the accuracy contract: per-tile INT8
# with 16-bit P·V falls below cosine 0.999 near a score std of 10 (q, k ~ N(0, std); the measured
# table is in docs/benchmarks.md, "accuracy contract"), since the INT8 score error grows with the
# score range. Layers past it are "peaky" and belong in full precision.
PEAKY_SCORE_STD = 10.0


def score_std(q: torch.Tensor, k: torch.Tensor, *, sm_scale: float | None = None, rows: int = 256) -> float:
    """Worst over (batch, head) of the standard deviation of the scaled scores q·kᵀ·sm_scale, on up to
    `rows` evenly spaced query rows against every key (fp32; HND; K/V heads broadcast over query-head
    groups). A diagnostic of how peaky attention is, not an exact statistic (masks are ignored)."""
    scale = q.shape[-1] ** -0.5 if sm_scale is None else sm_scale
    pick = torch.linspace(0, q.shape[2] - 1, min(rows, q.shape[2]), device=q.device).long()
    keys = k if k.shape[1] == q.shape[1] else k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    scores = (q[:, :, pick].float() @ keys.float().transpose(-1, -2)) * scale
    return float(scores.flatten(2).std(dim=-1).max())


def peaky_reason(std: float) -> str:
    """Why a layer with this score std is kept in full precision ('' when it is not peaky)."""
    if std < PEAKY_SCORE_STD:
        return ""
    return (f"peaky attention: score std {std:.0f} is past INT8's resolution (per-tile INT8 keeps cosine 0.999 only "
            f"up to a score std of about {PEAKY_SCORE_STD:.0f})")
