"""Block-sparse attention inside installed models (issue 36 stage 4a, docs/sparse.md).

A plan's choice may be sparse (`plans.Sparse`: dynamic or static tile selection at a target
density). Where the choice of an installed layer at the current step is, its router asks
`SparseRouting.tile_mask` for the call's mask, and `sageattn` computes the call on those tiles:

- what selection needs of the model comes from its family, one place per family
  (`families.SparseLayout`): which layers may be sparse and where their text sits (CogVideoX and
  Open-Sora: first; HunyuanVideo: last; Wan's self-attention: none; cross-attention and text-only
  layers never), and the latent grid of the running forward (read by a forward pre-hook on each
  denoiser, outside any compiled graph);
- the tiles are those of the kernel plan the call runs (`attention.sparse.select_tiles`); text rows
  and columns stay dense, as do the diagonal tiles and a sink tile;
- a call that cannot be sparse (a layer its family keeps dense, no grid, a sequence that is not
  the grid's video plus text, dropout, grouped K/V heads) runs dense, noted with the reason; every
  call under a plan with sparse choices is noted with its layer, step and density
  (`attention.records.report_sparse`: the manifest's `backends.sparse`).

Selection reads the device (the density; the dynamic selection's bisection), so it runs eagerly,
outside compiled graphs (`torch.compiler.disable`): a model compiled by its user breaks its graph
at each sparse call and stays correct; `sagevideo generate` refuses `--sparse` with `--compile`
before loading. The fused selection without host reads is stage 3.

`job_plan` is the plan `--sparse` builds for a job without a plan file: the setting on the job's
quantized attention, the first ceil(steps/5) steps and each denoiser's first sparse layer dense.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from sagevideo.attention.functional import broadcast_dims_dropped, key_padding_problem
from sagevideo.attention.records import SparseNote, report_sparse
from sagevideo.attention.sparse import select_tiles
from sagevideo.pipelines.families import TEXT_FIRST, TEXT_LAST, SparseLayout
from sagevideo.pipelines.plans import AttentionPlan, Choice, Mode, Sparse

NOT_SPARSE_LAYER = "a layer its family never makes sparse (cross-attention or text only)"
NO_GRID = "no latent grid for this forward (the transformer is not of a family that declares one)"
NOT_PLAIN = "a call the kernels cannot take block-sparse (dropout, grouped K/V heads, another shape)"

SELECTION_RANGE = "sagevideo::select_tiles"  # the profiler range of a call's tile selection


def grid_mismatch(n: int, grid: tuple[int, int, int], text: str | None) -> str:
    """The reason a call of `n` tokens does not hold the latent grid's video tokens (+ text)."""
    where = {TEXT_FIRST: "text first", TEXT_LAST: "text last", None: "no text"}[text]
    return (f"a sequence of {n} tokens does not hold the latent grid's {math.prod(grid)} video tokens "
            f"({'x'.join(map(str, grid))}, {where})")


class SparseRouting:
    """What an installed router's sparse calls share: each layer's text position (prefixed layer
    name -> TEXT_FIRST, TEXT_LAST or None; layers absent are never sparse) and the latent grid of
    the forward running now (set by `GridHook`)."""

    def __init__(self, text: dict[str, str | None] | None = None):
        self.text: dict[str, str | None] = dict(text or {})
        self.grid: tuple[int, int, int] | None = None

    def _text_tokens(self, layer: str, n: int) -> tuple[int, int] | str:
        """(text tokens first, text tokens last) of a call of `n` tokens of `layer`, or why it cannot be sparse."""
        if layer not in self.text:
            return NOT_SPARSE_LAYER
        if self.grid is None:
            return NO_GRID
        position = self.text[layer]
        text = n - math.prod(self.grid)
        if text < 0 or (position is None and text):
            return grid_mismatch(n, self.grid, position)
        return (text, 0) if position == TEXT_FIRST else (0, text) if position == TEXT_LAST else (0, 0)

    def select(self, layer: str, sparse: Sparse, q: torch.Tensor, k: torch.Tensor, *, pv: str,
               attn_mask: torch.Tensor | None = None, plain: bool = True) -> Any:
        """The tile mask `sparse` selects for one call of `layer` (HND q, k (B, H, N, D)) in the tiles
        of PV mode `pv`, or the reason (str) the call cannot be sparse; notes nothing (calibration
        measures masks it does not run). plain: whether the call is one the kernels take block-sparse
        (no dropout, as many K/V heads as query heads)."""
        text = self._text_tokens(layer, q.shape[2])
        if not isinstance(text, str) and (not plain or q.dim() != 4 or q.shape != k.shape):
            text = NOT_PLAIN
        if isinstance(text, str):
            return text
        with torch.profiler.record_function(SELECTION_RANGE):  # `sagevideo profile` counts it apart
            return select_tiles(q, k, method=sparse.method, density=sparse.density, pv=pv, text_first=text[0],
                                text_last=text[1], grid=self.grid, key_mask=_key_mask(attn_mask, k.shape[2]))

    @torch.compiler.disable  # reads the device: eagerly, between two graphs of a compiled model
    def tile_mask(self, layer: str, sparse: Sparse, q: torch.Tensor, k: torch.Tensor, *, pv: str,
                  step: int | None, attn_mask: torch.Tensor | None = None, plain: bool = True) -> Any:
        """The tile mask of one call of `layer` its plan makes `sparse` (`select`), or None (dense)
        with the reason noted."""
        mask = self.select(layer, sparse, q, k, pv=pv, attn_mask=attn_mask, plain=plain)
        if isinstance(mask, str):
            report_sparse(SparseNote(layer, step, 1.0, mask, planned=True))
            return None
        report_sparse(SparseNote(layer, step, mask.density, planned=True))
        return mask

    @torch.compiler.disable
    def note_dense(self, layer: str, step: int | None) -> None:
        """Note a call the plan runs dense at this step (density 1)."""
        report_sparse(SparseNote(layer, step, 1.0))


def _key_mask(attn_mask: torch.Tensor | None, n_k: int) -> torch.Tensor | None:
    """A boolean key-padding mask as (B', Nk) for the pooled scores, None for any other mask."""
    if attn_mask is None or attn_mask.dtype != torch.bool or key_padding_problem(attn_mask, n_k):
        return None
    mask = broadcast_dims_dropped(attn_mask)
    return mask.reshape(((1,) * (4 - mask.dim()) + tuple(mask.shape))[0], n_k)


class GridHook:
    """Forward pre-hook (with kwargs) of a denoiser: its layout's latent grid into the routing."""

    def __init__(self, routing: SparseRouting, layout: SparseLayout):
        self.routing, self.layout = routing, layout

    @torch.compiler.disable  # bookkeeping outside any graph (it may read the inputs on the host)
    def __call__(self, module: Any, args: tuple, kwargs: dict) -> None:
        self.routing.grid = self.layout.grid(module, args, kwargs)


def sparse_layers(transformer: Any, prefix: str = "") -> dict[str, str | None]:
    """The layers of `transformer` its family may make sparse (prefixed) -> their text position."""
    from sagevideo.pipelines.families import sparse_layout

    layout = sparse_layout(transformer)
    return {} if layout is None else {prefix + name: text for name, text in layout.text.items()}


def first_sparse_layers(pipe_or_transformer: Any) -> tuple[str, ...]:
    """Each denoiser's first attention layer (install's order) that its family may make sparse,
    as plans name it: the layers `--sparse` keeps dense by default."""
    from sagevideo.pipelines.install import attention_processors, denoisers_of

    firsts = []
    for component, transformer in denoisers_of(pipe_or_transformer).items():
        prefix = "" if component == "transformer" else f"{component}."
        layers = sparse_layers(transformer, prefix)
        names = (prefix + key.removesuffix(".processor") for key in attention_processors(transformer))
        first = next((name for name in names if name in layers), None)
        if first is not None:
            firsts.append(first)
    return tuple(firsts)


def job_plan(pipe: Any, pv: str, sparse: str, steps: int) -> AttentionPlan:
    """The plan of a job given `--sparse` text (not "off") and no plan file: INT8 QK with `pv` P·V
    everywhere, block-sparse but for the first ceil(steps/5) steps and each denoiser's first sparse
    layer (`AttentionPlan.sparse_default`)."""
    setting = Sparse.parse(sparse)
    if setting is None:
        raise ValueError("job_plan: --sparse off builds no plan (the job runs its own)")
    choice = Choice(mode=Mode(f"int8-{pv}"))
    return AttentionPlan.sparse_default(choice, setting, steps=steps, dense_layers=first_sparse_layers(pipe))
