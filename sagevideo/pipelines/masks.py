"""Key-padding masks that reach SDPA materialized, read back as the key masks the kernels take.

The kernels take a boolean key-padding mask (B, 1, 1, Nk). Some models build theirs into a bigger
tensor before SDPA: HunyuanVideo 1.5 as `m_q & m_k`, (B, 1|H, N, N) bool (a query mask times a key
mask, both the padded text's), LTX-Video and LTX-2 as an additive float copy per head (B, H, 1, Nk)
of 0 / -10000. A model family that knows its layers mask so declares them
(`ModelFamily.key_padding_layers`), and `install` routes those layers through `KeyPaddingRouter`:

- a mask that already is key padding (after dropping broadcast dims) goes on untouched, at no cost;
- any other mask is factored (`factor`): key mask = which keys any query attends, query mask =
  which queries attend any key, and checked exactly (on the device, one host sync per call: the
  family pays it, other models do not; under torch.compile the check runs eagerly between two
  graphs): the mask must equal query mask × key mask, with one key
  mask for every head, and a float mask may hold only 0 and a masked value (-inf, its dtype's
  min, or the family's own, e.g. -10000). The kernels then run with the key mask, and the rows
  of masked queries are set to 0, as SDPA gives for a row with no key (torch >= 2.5);
- a mask that is not so (a per-query pattern, other float values, a row whose keys are all
  masked by a finite value, where SDPA's softmax would spread over them) goes on as it came, so it
  runs SDPA, recorded as a fallback with the kernels' reason. Nothing is dropped or guessed.

Exactness of a finite masked value: SDPA gives such a key the weight exp(s - 10000 - max), below
fp32's smallest normal unless scores span ~9900, i.e. 0 as the kernels do.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from sagevideo.attention.functional import broadcast_dims_dropped, key_padding_problem
from sagevideo.pipelines.routing import AttentionRouter


@dataclass(frozen=True)
class KeyPadding:
    """How a layer's SDPA masks encode key padding. fill: the additive value a float mask gives
    masked keys besides -inf and its dtype's min (LTX: -10000), or None."""

    fill: float | None = None


@dataclass(frozen=True)
class Factored:
    """A mask read as key padding: key (B', 1, 1, Nk) bool for the kernels; query (B', 1|H, Nq|1, 1)
    bool, False where a query attends no key (its output row is 0), or None when every query attends."""

    key: torch.Tensor
    query: torch.Tensor | None


@torch.compiler.disable  # its answer decides what runs: in a compiled model, an eager call between two graphs
def factor(mask: torch.Tensor, form: KeyPadding) -> Factored | None:
    """`mask` (bool or additive float, broadcastable to (B, H, Nq, Nk)) as query mask x key mask, or None
    when it is not one (see the module docstring). One host sync."""
    if mask.dim() > 4 or mask.dim() < 1:
        return None
    mask = mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape))
    checks = []
    if mask.dtype == torch.bool:
        valid = mask
    elif mask.is_floating_point():
        valid = mask == 0
        fills = [-math.inf, torch.finfo(mask.dtype).min] + ([] if form.fill is None else [form.fill])
        masked = torch.zeros_like(valid)
        for value in fills:
            masked |= mask == torch.tensor(value, dtype=mask.dtype, device=mask.device)
        checks.append((valid | masked).all())
        finite = (masked & (mask != -math.inf)).any()
    else:
        return None
    keys = valid.any(-2)  # (B', h, Nk): keys some query attends
    per_row = valid.sum(-1)  # (B', h, Nq'): keys each query attends
    queries = per_row > 0
    # valid ⊆ queries × keys always; equal iff it holds as many entries (one key set for every attending row)
    checks.append((per_row.sum(-1) == queries.sum(-1) * keys.sum(-1)).all())
    checks.append((keys == keys[:, :1]).all())  # the kernels take one key mask for all heads
    every_query = queries.all()
    if mask.dtype != torch.bool:
        # a row whose keys all carry a finite value: SDPA spreads it over them all, not a masked row
        checks.append(every_query | ~finite)
    ok, attend_all = torch.stack([torch.stack(checks).all(), every_query]).tolist()
    if not ok:
        return None
    return Factored(keys[:, :1, None, :], None if attend_all else queries[..., None])


class KeyPaddingRouter(AttentionRouter):
    """The installed plan's router, reading the masks of the layers in `forms` (layer -> `KeyPadding`)
    as key padding where they are (`factor`); everything else goes to `inner` as it came."""

    def __init__(self, inner: AttentionRouter, forms: dict[str, KeyPadding]):
        self.inner = inner
        self.plan, self.backend, self.clock = inner.plan, inner.backend, inner.clock
        self.sparse = inner.sparse
        self.forms = forms

    def choice(self, layer: str):
        return self.inner.choice(layer)

    def route(self, layer: str):
        return self.inner.route(layer)

    def attend(self, route, q, k, v, *, attn_mask=None, **kwargs):
        form = None if attn_mask is None else self.forms.get(route.name)
        if form is None:  # unmasked calls read no layer name: compiled graphs stay shared across layers
            return self.inner.attend(route, q, k, v, attn_mask=attn_mask, **kwargs)
        return self._masked(lambda mask: self.inner.attend(route, q, k, v, attn_mask=mask, **kwargs),
                            attn_mask, q, k, form)

    def __call__(self, layer, q, k, v, *, attn_mask=None, **kwargs):
        form = None if attn_mask is None else self.forms.get(layer)
        if form is None:
            return self.inner(layer, q, k, v, attn_mask=attn_mask, **kwargs)
        return self._masked(lambda mask: self.inner(layer, q, k, v, attn_mask=mask, **kwargs),
                            attn_mask, q, k, form)

    @staticmethod
    def _masked(attend, mask: torch.Tensor, q: torch.Tensor, k: torch.Tensor, form: KeyPadding) -> torch.Tensor:
        """attend(mask) with `mask` read as key padding where it is one; q/k (B, H, N, D)."""
        if q.dim() != 4 or not key_padding_problem(mask, k.shape[-2]):
            return attend(mask)  # already what the kernels take, or a call of another rank: as it came
        factored = factor(broadcast_dims_dropped(mask), form)
        if factored is None:
            return attend(mask)  # SDPA, recorded with the kernels' reason for this mask
        out = attend(factored.key)
        return out if factored.query is None else out.masked_fill(~factored.query, 0)
