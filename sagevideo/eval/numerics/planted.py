"""Attention inputs with planted structure on a latent grid, and what a tile selection keeps of them.

Random-weight models attend near-uniformly, so their outputs say nothing about sparsity. These
inputs put the structure that video transformers show where it can be measured, at any shape:
- 3-D local windows: q and k carry random Fourier features of each token's (frame, row, column),
  so that q_i·k_j·sm_scale = sharpness · κ(x_i − x_j), κ a Gaussian of the grid distance with
  lengthscales `lengthscale` (κ(0) = 1): attention falls off with distance at a width of about
  lengthscale / √sharpness, while tokens within a tile stay alike (pooling can see them);
- temporal stripes (every `stripe_every`-th head): the same features without the frame axis, so
  a token attends its spatial neighbourhood in every frame;
- sinks: the first `sinks` video tokens' keys carry a channel every query shares (score
  sharpness − 1), and `global_tokens` keys at seeded positions another (sharpness − 2);
- text (`text_prefix` tokens before the video, `text_suffix` after): random q/k at unit scores.
V is standard normal. Everything is fp32, seeded, in raster token order (frames, rows, columns),
with `order` (a `grid_tile_order` permutation) applied to the video tokens when given.

Metrics of a tile mask on such inputs, exact in fp64 over every query row (chunked):
(a) the attention mass the kept tiles hold (per row; mean, worst row, worst head's mean);
(b) the output error of attention restricted to the mask against dense (cos per (batch, head),
worst and mean, `errors.error_stats`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from sagevideo.attention.accuracy import ErrorStats, error_stats
from sagevideo.kernels.sparse_reference import TileMask
from sagevideo.kernels.tile_select import grid_coordinates

RESERVED_CHANNELS = 2  # the sink and global-token channels


@dataclass(frozen=True)
class PlantedSpec:
    """Shape and structure of planted inputs: (batch, heads) and the latent grid (frames, height,
    width) at head dim `head_dim`; see the module docstring for the rest."""

    batch: int
    heads: int
    frames: int
    height: int
    width: int
    head_dim: int
    text_prefix: int = 0
    text_suffix: int = 0
    sharpness: float = 10.0
    lengthscale: tuple[float, float, float] = (3.0, 8.0, 8.0)
    stripe_every: int = 4
    sinks: int = 4
    global_tokens: int = 4
    noise: float = 0.05
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("batch", "heads", "frames", "height", "width"):
            if getattr(self, name) <= 0:
                raise ValueError(f"planted inputs: {name}={getattr(self, name)} must be positive")
        if self.head_dim < RESERVED_CHANNELS + 2:
            raise ValueError(f"planted inputs: head_dim={self.head_dim} must be at least {RESERVED_CHANNELS + 2}")
        if self.sinks + self.global_tokens > self.video_tokens:
            raise ValueError("planted inputs: more sinks and global tokens than video tokens")

    @property
    def video_tokens(self) -> int:
        return self.frames * self.height * self.width

    @property
    def tokens(self) -> int:
        return self.text_prefix + self.video_tokens + self.text_suffix

    @property
    def grid(self) -> tuple[int, int, int]:
        return self.frames, self.height, self.width

    def head_kind(self, head: int) -> str:
        """"stripe" (temporal stripes) or "local" (3-D window)."""
        return "stripe" if self.stripe_every and head % self.stripe_every == self.stripe_every - 1 else "local"


@dataclass
class PlantedInputs:
    """q, k, v (B, H, N, D) fp32 HND: [text_prefix; video in `order`; text_suffix]; sm_scale: D^-0.5."""

    spec: PlantedSpec
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    sm_scale: float
    order: torch.Tensor | None


def planted_inputs(spec: PlantedSpec, *, order: torch.Tensor | None = None,
                   device: torch.device | str = "cpu") -> PlantedInputs:
    """Seeded planted inputs (module docstring), built on `device`."""
    gen = torch.Generator(device="cpu").manual_seed(spec.seed)
    d = spec.head_dim
    features = (d - RESERVED_CHANNELS) // 2
    scale = d ** -0.5
    amplitude = math.sqrt(spec.sharpness / scale)  # q·k·scale = sharpness · φ·φ, φ·φ(0) = 1
    coords = grid_coordinates(*spec.grid, order).to(torch.float64)  # (N_video, 3)
    batch, heads, n_video = spec.batch, spec.heads, spec.video_tokens
    q_video = torch.zeros(heads, n_video, d, dtype=torch.float64)
    k_video = torch.zeros(heads, n_video, d, dtype=torch.float64)
    for head in range(heads):
        omega = torch.randn(features, 3, generator=gen, dtype=torch.float64) / torch.tensor(spec.lengthscale,
                                                                                           dtype=torch.float64)
        if spec.head_kind(head) == "stripe":
            omega[:, 0] = 0.0
        phase = coords @ omega.T  # (N_video, F)
        phi = torch.cat([torch.cos(phase), torch.sin(phase)], dim=-1) / math.sqrt(features)
        q_video[head, :, : 2 * features] = phi * amplitude
        k_video[head, :, : 2 * features] = phi * amplitude
    raster = torch.arange(n_video) if order is None else order.cpu()
    position = torch.empty(n_video, dtype=torch.long)
    position[raster] = torch.arange(n_video)  # where each raster token sits in the sequence
    special = torch.randperm(n_video - spec.sinks, generator=gen)[: spec.global_tokens] + spec.sinks
    channel_sink, channel_global = d - 2, d - 1
    q_video[:, :, channel_sink] = amplitude
    q_video[:, :, channel_global] = amplitude
    k_video[:, position[: spec.sinks], channel_sink] = amplitude * (spec.sharpness - 1) / spec.sharpness
    k_video[:, position[special], channel_global] = amplitude * (spec.sharpness - 2) / spec.sharpness

    def text(count: int) -> tuple[torch.Tensor, torch.Tensor]:
        shape = (heads, count, d)
        unit = d ** 0.25  # q·k·scale ~ N(0, 1)
        return (torch.randn(shape, generator=gen, dtype=torch.float64) * unit,
                torch.randn(shape, generator=gen, dtype=torch.float64) * unit)

    q_pre, k_pre = text(spec.text_prefix)
    q_suf, k_suf = text(spec.text_suffix)
    q = torch.cat([q_pre, q_video, q_suf], dim=1).expand(batch, -1, -1, -1)
    k = torch.cat([k_pre, k_video, k_suf], dim=1).expand(batch, -1, -1, -1)
    shape = (batch, heads, spec.tokens, d)
    q = q + spec.noise * torch.randn(shape, generator=gen, dtype=torch.float64)
    k = k + spec.noise * torch.randn(shape, generator=gen, dtype=torch.float64)
    v = torch.randn(shape, generator=gen, dtype=torch.float64)
    return PlantedInputs(spec, *(t.float().to(device) for t in (q, k, v)), sm_scale=scale, order=order)


@dataclass(frozen=True)
class MassStats:
    """Attention mass the kept tiles hold: mean over every (batch, head, query row), the worst row,
    the worst head's mean, and each head's mean (over batch rows and query rows)."""

    mean: float
    worst_row: float
    worst_head: float
    per_head: tuple[float, ...] = ()


@dataclass(frozen=True)
class SelectionQuality:
    """A tile mask judged on planted inputs: density (kept / all tiles), (a) mass, (b) output error
    of exact attention restricted to the mask against exact dense attention."""

    density: float
    mass: MassStats
    error: ErrorStats

    def as_dict(self) -> dict[str, float]:
        return {"density": self.density, "mass_mean": self.mass.mean, "mass_worst_row": self.mass.worst_row,
                "mass_worst_head": self.mass.worst_head, "cos_worst": self.error.cos_worst,
                "cos_mean": self.error.cos_mean, "rel_l1_worst": self.error.rel_l1_worst,
                "mass_per_head": list(self.mass.per_head)}


def dense_and_masked(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tile_mask: TileMask, *, sm_scale: float,
    key_mask: torch.Tensor | None = None, chunk_rows: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One fp64 pass over the query rows: (dense attention (B, H, Nq, D), attention restricted to the
    mask (0 on rows that keep no mass), the mass each row keeps (B, H, Nq))."""
    tile_mask.check_inputs(q, k)
    batch, heads, n_q, _ = q.shape
    n_k = k.shape[2]
    step = chunk_rows or max(tile_mask.block_m, (1 << 24) // max(1, batch * heads * n_k))
    k64, v64 = k.double(), v.double()
    valid = None if key_mask is None else key_mask.to(device=q.device, dtype=torch.bool)[:, None, None, :]
    dense, masked, mass = [], [], []
    for start in range(0, n_q, step):
        stop = min(start + step, n_q)
        s = (q[:, :, start:stop].double() @ k64.transpose(-1, -2)) * sm_scale
        if valid is not None:
            s = s.masked_fill(~valid, float("-inf"))
        p = torch.softmax(s, dim=-1)
        kept = p * tile_mask.token_mask(slice(start, stop)).to(p.device)
        row_mass = kept.sum(dim=-1)
        dense.append(p @ v64)
        masked.append(torch.where(row_mass[..., None] > 0, (kept @ v64) / row_mass.clamp(min=1e-300)[..., None], 0.0))
        mass.append(row_mass)
    return torch.cat(dense, dim=2), torch.cat(masked, dim=2), torch.cat(mass, dim=2)


def selection_quality(inputs: PlantedInputs, tile_mask: TileMask, *, chunk_rows: int | None = None) -> SelectionQuality:
    """(a) and (b) of a tile mask on planted inputs."""
    dense, masked, mass = dense_and_masked(inputs.q, inputs.k, inputs.v, tile_mask, sm_scale=inputs.sm_scale,
                                           chunk_rows=chunk_rows)
    stats = MassStats(mean=float(mass.mean()), worst_row=float(mass.min()), worst_head=float(mass.mean(dim=2).min()),
                      per_head=tuple(round(float(m), 4) for m in mass.mean(dim=(0, 2))))
    return SelectionQuality(density=tile_mask.density, mass=stats, error=error_stats(dense, masked))
