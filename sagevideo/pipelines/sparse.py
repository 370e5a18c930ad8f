"""Block-sparse attention inside installed models (issue 36 stage 4a, docs/sparse.md).

A plan's choice may be sparse (`plans.Sparse`: dynamic or static tile selection at a target
density). Where the choice of an installed layer at the current step is, its router asks
`SparseRouting.call_mask` for the call's mask, and `sageattn` computes the call on those tiles:

- what selection needs of the model comes from its family, one place per family
  (`families.SparseLayout`): which layers may be sparse and where their text sits (CogVideoX and
  Open-Sora: first; HunyuanVideo: last; Wan's self-attention: none; cross-attention and text-only
  layers never), and the latent grid of the running forward (read by a forward pre-hook on each
  denoiser, outside any compiled graph);
- the tiles are those of the kernel plan the call runs (`attention.sparse`); text rows and columns
  stay dense, as do the diagonal tiles and a sink tile;
- a call that cannot be sparse (a layer its family keeps dense, no grid, a sequence that is not
  the grid's video plus text, dropout, grouped K/V heads) runs dense, noted with the reason; every
  call under a plan with sparse choices is noted with its layer, step and density
  (`pipelines.sparse_notes`, then `attention.records.report_sparse`: the manifest's `backends.sparse`).

Nothing here reads the device, so a model compiled by its user keeps whole graphs (no break at a
sparse call): a dynamic call passes `attention.sparse.dynamic_selection` (the plan's calibrated
top_p where it has one: each query tile keeps the tiles that reach that estimated mass; else a
per-row density: each query tile keeps about that share of its key tiles), which the call selects on the device inside
its own preparation (the PyTorch definition where the Triton kernels do not run); a static call's
mask depends on no input and is a constant to torch.compile. Calls are noted alike eagerly and inside
a compiled graph: each sparse call adds its density to its layer's statistics on the device, read at
the end of each forward (`pipelines.sparse_notes`).

`job_plan` is the plan `--sparse` builds for a job without a plan file: the setting on the job's
quantized attention, the first ceil(steps/5) steps and each denoiser's first sparse layer dense.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any

import torch

from sagevideo.attention.functional import broadcast_dims_dropped, key_padding_problem
from sagevideo.attention.sparse import dynamic_selection, key_tiles_of, scores_at, select_tiles
from sagevideo.pipelines.families import TEXT_FIRST, TEXT_LAST, SparseLayout
from sagevideo.pipelines.plans import AttentionPlan, Choice, Mode, Sparse

NOT_SPARSE_LAYER = "a layer its family never makes sparse (cross-attention or text only)"
NO_GRID = "no latent grid for this forward (the transformer is not of a family that declares one)"
NOT_PLAIN = "a call the kernels cannot take block-sparse (dropout, grouped K/V heads, another shape)"

SELECTION_RANGE = "sagevideo::select_tiles"  # the profiler range of a call's tile selection
NOT_SPARSE = "not-sparse"  # a layer's text position where its family never makes it sparse


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
        self.forwards = 0  # forwards of the current step so far (the router resets it when the clock moves)
        self.on_forward: list[Any] = []  # callbacks(forward index in the step), before each forward
        # between an installed denoiser's forward start and its end-of-forward collection: calls by
        # name (Ulysses routes every call so) are then noted at that collection, not one by one
        self.in_forward = False

    def forward_started(self) -> None:
        """A denoiser forward starts (outside compiled code): the callbacks get its index in the step."""
        for callback in self.on_forward:
            callback(self.forwards)
        self.forwards += 1
        self.in_forward = True

    def text_of(self, layer: str) -> str | None:
        """The text position of `layer` (prefixed name): TEXT_FIRST, TEXT_LAST, None (no text), or
        NOT_SPARSE for a layer its family never makes sparse. Routes keep it, so that compiled code
        reads a value layers share rather than each layer's name (one graph for every layer)."""
        return self.text.get(layer, NOT_SPARSE)

    def _text_tokens(self, position: str | None, n: int) -> tuple[int, int] | str:
        """(text tokens first, text tokens last) of a call of `n` tokens of a layer whose text sits at
        `position` (`text_of`), or why it cannot be sparse."""
        if position == NOT_SPARSE:
            return NOT_SPARSE_LAYER
        if self.grid is None:
            return NO_GRID
        text = n - math.prod(self.grid)
        if text < 0 or (position is None and text):
            return grid_mismatch(n, self.grid, position)
        return (text, 0) if position == TEXT_FIRST else (0, text) if position == TEXT_LAST else (0, 0)

    def _checked(self, position: str | None, q: torch.Tensor, k: torch.Tensor, plain: bool) -> tuple[int, int] | str:
        text = self._text_tokens(position, q.shape[2])
        if not isinstance(text, str) and (not plain or q.dim() != 4 or q.shape != k.shape):
            return NOT_PLAIN
        return text

    def select(self, layer: str, sparse: Sparse, q: torch.Tensor, k: torch.Tensor, *, pv: str,
               attn_mask: torch.Tensor | None = None, plain: bool = True, sm_scale: float | None = None) -> Any:
        """The tile mask (`TileMask`) `sparse` selects for one call of `layer` (HND q, k (B, H, N, D))
        in the tiles of PV mode `pv`, the rule installed calls run (for dynamic selection the plan's
        top_p where it has one, else a per-row density), or the reason (str) the call cannot be
        sparse; notes nothing (calibration measures masks it does not run). plain: whether the call
        is one the kernels take block-sparse (no dropout, as many K/V heads as query heads)."""
        text = self._checked(self.text_of(layer), q, k, plain)
        if isinstance(text, str):
            return text
        with torch.profiler.record_function(SELECTION_RANGE):  # `sagevideo profile` counts it apart
            return select_tiles(q, k, method=sparse.method, density=sparse.density, pv=pv, text_first=text[0],
                                text_last=text[1], grid=self.grid, key_mask=_key_mask(attn_mask, k.shape[2]),
                                top_p=sparse.top_p, sm_scale=sm_scale)

    def scores(self, layer: str, q: torch.Tensor, k: torch.Tensor, *, pv: str, attn_mask: torch.Tensor | None = None,
               plain: bool = True, sm_scale: float | None = None) -> Any:
        """The `TileScores` a dynamic call of `layer` (HND q, k (B, H, N, D)) selects from in the tiles of
        PV mode `pv` (`attention.sparse.scores_at`: the installed settings), or the reason (str) the
        call cannot be sparse; calibration reads from them the density each top_p reaches."""
        text = self._checked(self.text_of(layer), q, k, plain)
        if isinstance(text, str):
            return text
        return scores_at(q, k, pv=pv, text_first=text[0], text_last=text[1],
                         key_mask=_key_mask(attn_mask, k.shape[2]), sm_scale=sm_scale)

    def call_mask(self, position: str | None, sparse: Sparse, q: torch.Tensor, k: torch.Tensor, *, pv: str,
                  attn_mask: torch.Tensor | None = None, plain: bool = True) -> Any:
        """What one call of a layer at text `position` passes as `tile_mask` (no host read): for dynamic
        selection the `DynamicSelection` the call selects with (the plan's top_p where it has one,
        else its per-row density; a `TileMask` of the same rule where attn_mask is not key padding,
        which the one-call selection does not take), for static the grid's constant mask; or the
        reason (str) the call cannot be sparse."""
        text = self._checked(position, q, k, plain)
        if isinstance(text, str):
            return text
        if sparse.method == "dynamic" and (attn_mask is None or _key_mask(attn_mask, k.shape[2]) is not None):
            return dynamic_selection(sparse.density, key_tiles=key_tiles_of(k, pv), top_p=sparse.top_p,
                                     text_first=text[0], text_last=text[1])  # selected in the call
        # `sagevideo profile` counts the selection apart (eagerly: a graph holds no profiler range)
        ranged = contextlib.nullcontext() if torch.compiler.is_compiling() else torch.profiler.record_function(
            SELECTION_RANGE)
        with ranged:
            return select_tiles(q, k, method=sparse.method, density=sparse.density, pv=pv, text_first=text[0],
                                text_last=text[1], grid=self.grid, top_p=sparse.top_p)


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
        self.routing.forward_started()


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
