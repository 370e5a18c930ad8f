"""Open-Sora 2.0's 3D rotary position embedding: the frequency table and the rotate-half rotation.

The released checkpoint was trained with Liger's RoPE kernel (`use_liger_rope=True`), which rotates
the pairs (x_j, x_{j+D/2}) ("rotate half", the Llama/NeoX convention). Flux, and diffusers' Flux
port, rotate interleaved pairs (x_{2j}, x_{2j+1}) instead; using that here on the released weights
gives visibly wrong videos, so this module is written from the rotate-half formula directly.

Positions are (t, h, w) per token: latent frame index, row and column in patch units. Text tokens
have position 0 on every axis, so they are not rotated.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def rope_tables(ids: torch.Tensor, axes_dim: Sequence[int], theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables of the joint sequence.

    ids: (B, L, n_axes) float token positions (in the model dtype, as the official model passes
    them; integers up to 256 are exact in bf16). Only batch row 0 is used: Liger's kernel reads
    row `program_id % L` of the contiguous table, i.e. row 0 for every batch element, and
    Open-Sora's positions are the same across the batch anyway.

    Returns (cos, sin), each (1, L, sum(axes_dim)) float32. For axis a of dim d_a the angles are
    pos_a * theta^(-2j/d_a), j < d_a/2, in fp32; the per-axis angles are concatenated
    ([t | h | w], sum(axes_dim)/2 frequencies) and the table is then repeated twice along the last
    dim, so that entry j and entry j + D/2 hold the same angle (rotate-half layout).
    """
    if ids.shape[-1] != len(axes_dim):
        raise ValueError(f"ids have {ids.shape[-1]} axes but axes_dim has {len(axes_dim)}: {list(axes_dim)}")
    angles = []
    for axis, dim in enumerate(axes_dim):
        if dim % 2:
            raise ValueError(f"every entry of axes_dim must be even, got {list(axes_dim)}")
        # omega in float64 and rounded once to fp32: the correctly rounded value of theta^(-2j/d).
        exponents = torch.arange(0, dim, 2, dtype=torch.float64) / dim
        omega = (1.0 / theta**exponents).to(device=ids.device, dtype=torch.float32)
        angles.append(ids[:1, :, axis].float()[..., None] * omega)
    half = torch.cat(angles, dim=-1)
    cos, sin = half.cos(), half.sin()
    return torch.cat([cos, cos], dim=-1), torch.cat([sin, sin], dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate q or k, (B, H, L, D), by the tables (B' in {1, B}, L, D); same shape and dtype as x.

    For j < D/2: out_j = x_j c_j - x_{j+D/2} s_j and out_{j+D/2} = x_{j+D/2} c_j + x_j s_j,
    computed in fp32 and stored in x's dtype (as Liger's kernel does).
    """
    xf = x.float()
    x1, x2 = xf.chunk(2, dim=-1)
    rotated = torch.cat([-x2, x1], dim=-1)
    out = xf * cos[:, None] + rotated * sin[:, None]
    return out.to(x.dtype)
