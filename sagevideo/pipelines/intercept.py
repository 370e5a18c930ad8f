"""Scoped SDPA interception for transformers on diffusers' attention dispatcher (Wan, HunyuanVideo,
LTX, Flux-like): their processors end in `F.scaled_dot_product_attention` (the dispatcher's
"native" backend), which sagevideo cannot reach by swapping processors without copying each.

While (and only while) the transformer's forward runs, a `TorchFunctionMode` routes those SDPA
calls to the plan's attention; forward hooks on each attention module say which layer is
calling. Nothing global is reassigned: the text encoder, the VAE and any code outside the
transformer keep plain SDPA.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from sagevideo.pipelines.routing import AttentionRouter


class _SDPAToRouter(TorchFunctionMode):
    """Sends F.scaled_dot_product_attention calls to the router under the current layer name."""

    def __init__(self, router: AttentionRouter, layer_of_call: list[str]):
        super().__init__()
        self.router = router
        self.layer_of_call = layer_of_call

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention and self.layer_of_call:
            routed = _route(self.router, self.layer_of_call[-1], *args, **kwargs)
            if routed is not None:
                return routed
        return func(*args, **kwargs)


def _route(router, layer, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
           enable_gqa=False):
    """The router's output for one intercepted SDPA call, with every SDPA argument (grouped-query
    heads run in the kernels; dropout runs SDPA, recorded as a fallback)."""
    return router(layer, query, key, value, attn_mask=attn_mask, is_causal=is_causal, sm_scale=scale,
                  dropout_p=dropout_p, enable_gqa=enable_gqa)


class SDPAInterception:
    """Installed interception on one transformer; `remove()` undoes every hook and wrapper."""

    def __init__(self, transformer: torch.nn.Module, layers: dict[str, torch.nn.Module], router: AttentionRouter):
        self.transformer = transformer
        self.layer_of_call: list[str] = []
        self._handles = []
        for name, module in layers.items():
            self._handles.append(module.register_forward_pre_hook(functools.partial(self._enter, name)))
            self._handles.append(module.register_forward_hook(self._leave, always_call=True))
        mode_factory = functools.partial(_SDPAToRouter, router, self.layer_of_call)
        forward = transformer.forward

        @functools.wraps(forward)
        def forward_with_interception(*args: Any, **kwargs: Any):
            with mode_factory():
                return forward(*args, **kwargs)

        transformer.forward = forward_with_interception

    def _enter(self, name: str, module, args) -> None:
        self.layer_of_call.append(name)

    def _leave(self, module, args, output) -> None:
        if self.layer_of_call:
            self.layer_of_call.pop()

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self.transformer.__dict__.pop("forward", None)  # the class's forward shows through again
