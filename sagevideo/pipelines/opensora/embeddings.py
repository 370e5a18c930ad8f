"""The conditioning embedders: sinusoidal timestep embedding and the two-layer MLP embedder."""

from __future__ import annotations

import math

import torch
from torch import nn


def timestep_embedding(
    timesteps: torch.Tensor, dim: int = 256, max_period: float = 10000.0, time_factor: float = 1000.0
) -> torch.Tensor:
    """Sinusoidal embedding of sigma, (B,) -> (B, dim), cos first.

    The argument is time_factor * sigma (1000 * sigma), multiplied in the dtype `timesteps` come in
    (the official sampler passes them in the model dtype), with frequencies
    exp(-ln(max_period) * j / (dim/2)) in fp32. The result is cast back to `timesteps`' dtype.
    """
    if dim % 2:
        raise ValueError(f"timestep embedding dim must be even, got {dim}")
    t = time_factor * timesteps
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(half, dtype=torch.float32, device=t.device) / half)
    args = t[:, None].float() * freqs[None]
    emb = torch.cat([torch.cos(args), torch.sin(args)], dim=-1)
    return emb.to(timesteps.dtype) if timesteps.is_floating_point() else emb


class OpenSoraMLPEmbedder(nn.Module):
    """Linear -> SiLU -> Linear, (B, in_dim) -> (B, hidden). Official name: MLPEmbedder
    (in_layer, out_layer) for `time_in` and `vector_in`."""

    def __init__(self, in_dim: int, hidden: int):
        super().__init__()
        self.linear_1 = nn.Linear(in_dim, hidden)
        self.act = nn.SiLU()
        self.linear_2 = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_2(self.act(self.linear_1(x)))
