"""Small building blocks of the Open-Sora 2.0 MMDiT: QK-RMSNorm, adaLN modulation, feed-forward."""

from __future__ import annotations

import torch
from torch import nn


class OpenSoraRMSNorm(nn.Module):
    """RMSNorm over the head dim with a learned scale, (..., D) -> (..., D) in x's dtype.

    Llama casting (Liger's "llama" mode, the official QK norm): the normalisation runs in fp32 and
    is cast back to x's dtype *before* the multiplication by the weight, so in bf16 the rounding
    happens where the official model rounds. Official parameter name: `scale`.
    """

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        normed = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return normed.to(x.dtype) * self.weight


class OpenSoraModulation(nn.Module):
    """adaLN modulation: `linear(silu(vec))` split into `chunks` tensors of (B, 1, dim).

    Double blocks use 6 chunks (shift1, scale1, gate1, shift2, scale2, gate2), single blocks 3
    (shift, scale, gate), in that order, as the official `Modulation.lin` rows are laid out.
    """

    def __init__(self, dim: int, chunks: int):
        super().__init__()
        self.chunks = chunks
        self.linear = nn.Linear(dim, chunks * dim)

    def forward(self, vec: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return self.linear(nn.functional.silu(vec))[:, None, :].chunk(self.chunks, dim=-1)


class OpenSoraFeedForward(nn.Module):
    """Linear -> GELU(tanh) -> Linear, (B, L, dim) -> (B, L, dim). Official: `{img,txt}_mlp.{0,2}`."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.fc_in = nn.Linear(dim, hidden)
        self.act = nn.GELU(approximate="tanh")
        self.fc_out = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc_out(self.act(self.fc_in(x)))


def modulate(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """(1 + scale) * x + shift, the adaLN form used by every block and the final layer."""
    return (1 + scale) * x + shift
