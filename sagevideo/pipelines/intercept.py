"""Scoped SDPA interception for transformers on diffusers' attention dispatcher (Wan, HunyuanVideo,
LTX, Flux-like): their processors end in `F.scaled_dot_product_attention` (the dispatcher's
"native" backend), which sagevideo cannot reach by swapping processors without copying each.

While (and only while) the transformer's forward runs, a `TorchFunctionMode` routes those SDPA
calls to the plan's attention; forward hooks on each attention module say which layer is
calling. Nothing global is reassigned: the text encoder, the VAE and any code outside the
transformer keep plain SDPA.

The mode is entered by a forward pre-hook on the transformer and left by its forward hook
(`always_call`, so an exception leaves it too). `transformer.forward` itself is never replaced:
what others wrap it with (diffusers' `HookRegistry`: caches, group offloading; accelerate's
offload hooks), before or after install, keeps running, and `remove()` takes away sagevideo's
own hooks and nothing else.
"""

from __future__ import annotations

import functools

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
    """The router's output, or None when the call uses something sageattn does not do
    (dropout, grouped-query heads): then plain SDPA runs, as the caller asked."""
    if dropout_p or (enable_gqa and key.shape[-3] != query.shape[-3]):
        return None
    return router(layer, query, key, value, attn_mask=attn_mask, is_causal=is_causal, sm_scale=scale)


class SDPAInterception:
    """Installed interception on one transformer; `remove()` undoes every hook it added.

    layers: layer name (as plans name it) -> attention module.
    """

    def __init__(self, transformer: torch.nn.Module, layers: dict[str, torch.nn.Module], router: AttentionRouter):
        self.transformer = transformer
        self.router = router
        self.layer_of_call: list[str] = []
        self._modes: list[_SDPAToRouter] = []  # one per running forward (re-entrant)
        self._handles = []
        for name, module in layers.items():
            self._handles.append(module.register_forward_pre_hook(functools.partial(self._enter, name)))
            self._handles.append(module.register_forward_hook(self._leave, always_call=True))
        self._handles.append(transformer.register_forward_pre_hook(self._enter_forward))
        self._handles.append(transformer.register_forward_hook(self._leave_forward, always_call=True))

    def _enter(self, name: str, module, args) -> None:
        self.layer_of_call.append(name)

    def _leave(self, module, args, output) -> None:
        if self.layer_of_call:
            self.layer_of_call.pop()

    def _enter_forward(self, module, args) -> None:
        mode = _SDPAToRouter(self.router, self.layer_of_call)
        mode.__enter__()
        self._modes.append(mode)

    def _leave_forward(self, module, args, output) -> None:
        if self._modes:  # empty when an earlier pre-hook raised before ours entered the mode
            self._modes.pop().__exit__(None, None, None)

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
