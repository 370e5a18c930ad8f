"""Scoped SDPA interception for transformers on diffusers' attention dispatcher (Wan, HunyuanVideo,
LTX, Flux-like): their processors end in `F.scaled_dot_product_attention` (the dispatcher's
"native" backend), which sagevideo cannot reach by swapping processors without copying each.

While (and only while) an attention layer of the transformer runs, a `TorchFunctionMode` of that
layer routes its SDPA calls to the plan's attention: one mode per layer, made at install time and
bound to the layer's `LayerRoute`, entered by a forward pre-hook on the attention module and left
by its forward hook. Nothing global is reassigned: the text encoder, the VAE and any code outside
the attention layers keep plain SDPA. `transformer.forward` itself is never replaced: what others
wrap it with (diffusers' `HookRegistry`: caches, group offloading; accelerate's offload hooks),
before or after install, keeps running, and `remove()` takes away sagevideo's own hooks and nothing else.

It compiles cleanly (regional compile of each transformer block, or the whole transformer): the
graph reads no layer name, no step and no counter, only the route's choice (layers with equal
choices share one graph); the per-forward tallies are kept by an effectful op
(`sagevideo::note_attention`) that counts each time the compiled code runs, as the backend
records are; Tensor methods written in Python (`Tensor.unflatten`, which Dynamo cannot trace
through a mode) are traced as the method calls they are.

A forward whose attention layers ran but routed no call at all (e.g. diffusers' "flex" backend
set on the processors, which never calls SDPA) is reported: a warning once per installed handle,
and a note in every active `record_backends()` log.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Iterable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode, _get_current_function_mode_stack

from sagevideo.attention.records import register_effect, report_unrouted
from sagevideo.pipelines.routing import AttentionRouter, LayerRoute

# diffusers attention-dispatcher backends whose functions call F.scaled_dot_product_attention
# (without a context-parallel config): the only ones the interception can reach.
SDPA_DISPATCHER_BACKENDS = frozenset({"native", "_native_cudnn", "_native_efficient", "_native_flash", "_native_math"})

@dataclass
class _ForwardTally:
    """What one transformer forward did: attention layers entered, SDPA calls seen inside them,
    and those the router computed."""

    layers: int = 0
    seen: int = 0
    routed: int = 0


_forwards = threading.local()  # .tallies: the running forwards' tallies of this thread, innermost last


def _tallies() -> list[_ForwardTally]:
    tallies = getattr(_forwards, "tallies", None)
    if tallies is None:
        tallies = _forwards.tallies = []
    return tallies


def _count(event: str) -> None:
    """Note one `event` in the innermost running forward's tally: "layers" (an attention layer
    ran), "seen" (an SDPA call the router did not take), "routed" (one it computed; seen too)."""
    tallies = _tallies()
    if tallies:
        tally = tallies[-1]
        if event == "layers":
            tally.layers += 1
        else:
            tally.seen += 1
            tally.routed += event == "routed"


@torch.library.custom_op("sagevideo::note_attention", mutates_args=())
def _note_attention_op(event: str) -> None:
    _count(event)


@_note_attention_op.register_fake
def _(event: str) -> None:
    return None


register_effect("note_attention")


def _note(event: str) -> None:
    """`_count(event)`, also each time a compiled graph runs: inside a graph being traced, the
    effectful op that counts at run time (a Python counter would be read once, while tracing)."""
    if torch.compiler.is_compiling():
        torch.ops.sagevideo.note_attention(event)
    else:
        _count(event)


class _SDPAToRouter(TorchFunctionMode):
    """One attention layer's interception: sends its F.scaled_dot_product_attention calls to the
    router with the layer's route; everything else runs as it would."""

    def __init__(self, router: AttentionRouter, route: LayerRoute, owner: object):
        super().__init__()
        self.router = router
        self.route = route
        self.owner = owner  # the SDPAInterception: what its forward hook may pop after an exception

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            routed = _route(self.router, self.route, *args, **kwargs)
            _note("routed" if routed is not None else "seen")
            if routed is not None:
                return routed
        elif torch.compiler.is_compiling() and args and isinstance(args[0], torch.Tensor):
            # Dynamo cannot inline Tensor methods written in Python (`super().unflatten()` in
            # Tensor.unflatten); as the bound method (the mode is off inside this call) it traces them.
            name = getattr(func, "__name__", "")
            if getattr(torch.Tensor, name, None) is func:
                return getattr(args[0], name)(*args[1:], **kwargs)
        return func(*args, **kwargs)


class _LayerHooks:
    """The pre-hook and hook that enter and leave one layer's mode. Inside the transformer's forward
    the transformer's always-called hook leaves modes an exception left entered (an `always_call`
    layer hook would add its id as a per-layer guard to compiled blocks); a layer called on its own,
    outside that forward, gets a one-off always-called hook for the same cleanup."""

    def __init__(self, mode: _SDPAToRouter):
        self.mode = mode

    def enter(self, module, args) -> None:
        self.mode.__enter__()
        if not torch.compiler.is_compiling() and not self.mode.owner._active:
            cleanup = _LeaveOnExit(self.mode)
            cleanup.handle = module.register_forward_hook(cleanup, always_call=True)

    def leave(self, module, args, output) -> None:
        self.mode.__exit__(None, None, None)
        _note("layers")


class _LeaveOnExit:
    """One-off always-called forward hook of a layer run outside its transformer's forward: leaves
    the layer's mode if the layer raised before its own hook could, then removes itself."""

    def __init__(self, mode: _SDPAToRouter):
        self.mode = mode
        self.handle = None

    def __call__(self, module, args, output) -> None:
        self.handle.remove()
        while self.mode in _get_current_function_mode_stack():
            top = _get_current_function_mode_stack()[-1]
            top.__exit__(None, None, None)  # modes entered inside the layer after ours go with it


def _route(router, route, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
           enable_gqa=False):
    """The router's output for one intercepted SDPA call, with every SDPA argument (grouped-query
    heads run in the kernels; dropout runs SDPA, recorded as a fallback)."""
    return router.attend(route, query, key, value, attn_mask=attn_mask, is_causal=is_causal, sm_scale=scale,
                         dropout_p=dropout_p, enable_gqa=enable_gqa)


def _active_dispatcher_backend() -> str | None:
    """diffusers' process-wide attention backend (what processors without their own use), or None."""
    try:
        from diffusers.models.attention_dispatch import _AttentionBackendRegistry

        backend = _AttentionBackendRegistry.get_active_backend()[0]
    except Exception:  # a diffusers without the dispatcher, or a changed private API: nothing to report
        return None
    return str(getattr(backend, "value", backend))


def dispatcher_backends(modules: Iterable[torch.nn.Module]) -> set[str]:
    """Names of the diffusers dispatcher backends the processors of `modules` would call
    (`processor._attention_backend`, else the process-wide one); empty for non-dispatcher processors."""
    names: set[str] = set()
    for module in modules:
        processor = getattr(module, "processor", None)
        if processor is None or not hasattr(processor, "_attention_backend"):
            continue
        backend = processor._attention_backend
        name = str(getattr(backend, "value", backend)) if backend is not None else _active_dispatcher_backend()
        if name is not None:
            names.add(name)
    return names


def non_sdpa_backend_advice(label: str, modules: Iterable[torch.nn.Module]) -> str | None:
    """Why and how to fix, when some processors of `modules` use a dispatcher backend that never
    calls SDPA (e.g. "flex"); None when every one reaches SDPA."""
    others = sorted(dispatcher_backends(modules) - SDPA_DISPATCHER_BACKENDS)
    if not others:
        return None
    return (
        f"{label}'s attention processors use diffusers' attention backend {', '.join(map(repr, others))}, which "
        "does not call torch's scaled_dot_product_attention, so sagevideo cannot route it; call "
        f"{label}.set_attention_backend('native') before running it"
    )


class UnroutedForwards:
    """Shared by the interceptions of one installed handle: warns once, and notes in the active
    `record_backends()` logs every forward whose attention layers ran but routed no call."""

    def __init__(self) -> None:
        self.warned = False
        self.ever_routed = False

    def check(self, label: str, tally: _ForwardTally, modules: Iterable[torch.nn.Module], replaced: bool,
              transformer: torch.nn.Module | None = None) -> None:
        """After a forward: `replaced` says whether some attention module's processor changed since install."""
        if tally.routed:
            self.ever_routed = True
            return
        if not tally.layers:
            # No attention layer ran through sagevideo's hooks: a cache that reused the whole output, or
            # attention in compiled code traced without the hooks, which must not pass for a cache.
            if transformer is None or _may_skip_attention(transformer):
                return
            reason = (f"a {label} forward ran none of its attention layers through sagevideo's hooks, and no cache "
                      "hook skips them: they ran in code torch.compile traced before install (stock SDPA, "
                      "unrecorded); call torch._dynamo.reset() and run again, or install before compiling")
        else:
            reason = _unrouted_reason(label, tally, modules, self.ever_routed and not replaced)
        if reason is None:
            return
        report_unrouted(reason)
        if not self.warned:
            self.warned = True
            warnings.warn(f"sagevideo: {reason}", stacklevel=2)


def _may_skip_attention(transformer: torch.nn.Module) -> bool:
    """Whether something on the transformer may legitimately run a forward without its attention
    layers: a diffusers hook (caches such as FirstBlockCache, MagCache, FasterCache register them)
    or a module's forward replaced on the instance (caches outside diffusers patch forwards)."""
    for module in transformer.modules():
        registry = getattr(module, "_diffusers_hook", None)
        if registry is not None and getattr(registry, "hooks", None):
            return True
        if "forward" in vars(module):
            return True
    return False


def _unrouted_reason(label: str, tally: _ForwardTally, modules, routed_before: bool) -> str | None:
    """Why a forward with attention layers routed nothing, or None when that is expected.
    routed_before: these very processors routed calls in an earlier forward."""
    if tally.seen:
        return (
            f"a {label} forward routed none of its attention calls: each asked for what sagevideo does not compute"
            " (dropout_p > 0, e.g. a model in train() mode, or fewer K/V heads with enable_gqa); stock SDPA ran"
        )
    advice = non_sdpa_backend_advice(label, modules)
    if advice is not None:
        return f"a {label} forward routed no attention call: {advice}"
    if routed_before:
        # The same processors reached SDPA before: skipping attention now is a cache's doing (e.g. attention
        # broadcast reusing every layer's output for a step), not a silent fallback.
        return None
    kinds = sorted({type(getattr(m, "processor", None)).__name__ for m in modules})
    return (
        f"a {label} forward routed no attention call: its attention processors ({', '.join(kinds)}) do not call "
        "torch's scaled_dot_product_attention, so stock attention ran; sagevideo routes processors that do "
        "(diffusers' 'native' attention backend)"
    )


class SDPAInterception:
    """Installed interception on one transformer; `remove()` undoes every hook it added.

    layers: layer name (as plans name it) -> attention module; label: the transformer's name in
    messages ("pipe.transformer_2"); unrouted: the handle's shared `UnroutedForwards`.
    """

    def __init__(
        self,
        transformer: torch.nn.Module,
        layers: dict[str, torch.nn.Module],
        router: AttentionRouter,
        *,
        label: str = "transformer",
        unrouted: UnroutedForwards | None = None,
    ):
        self.transformer = transformer
        self.router = router
        self.label = label
        self.unrouted = unrouted if unrouted is not None else UnroutedForwards()
        self._modules = list(layers.values())
        self._processors = [getattr(m, "processor", None) for m in self._modules]  # at install
        self._active: list[_ForwardTally] = []  # one per running forward of this transformer (re-entrant)
        self._handles = []
        for name, module in layers.items():
            hooks = _LayerHooks(_SDPAToRouter(router, router.route(name), self))
            self._handles.append(module.register_forward_pre_hook(hooks.enter))
            self._handles.append(module.register_forward_hook(hooks.leave))
        self._handles.append(transformer.register_forward_pre_hook(self._enter_forward))
        self._handles.append(transformer.register_forward_hook(self._leave_forward, always_call=True))

    # The transformer's own hooks are bookkeeping outside any graph: compiled whole (`model.compile()`),
    # Dynamo would otherwise compile them as frames of their own and guard on the tallies' state
    # (a recompile on the second forward).
    @torch.compiler.disable
    def _enter_forward(self, module, args) -> None:
        tally = _ForwardTally()
        _tallies().append(tally)
        self._active.append(tally)

    @torch.compiler.disable
    def _leave_forward(self, module, args, output) -> None:
        self._leave_modes_left_entered()
        if not self._active:  # an earlier pre-hook raised before ours ran
            return
        tally = self._active.pop()
        tallies = _tallies()
        if tally in tallies:
            tallies.remove(tally)
        if output is not None:  # None: the forward raised; its error says what happened
            replaced = not tally.routed and self._processors_replaced()
            self.unrouted.check(self.label, tally, self._modules, replaced, self.transformer)

    def _leave_modes_left_entered(self) -> None:
        """Leave this interception's layer modes that an exception inside a layer left on the stack."""
        while True:
            stack = _get_current_function_mode_stack()
            if not stack or getattr(stack[-1], "owner", None) is not self:
                return
            stack[-1].__exit__(None, None, None)

    def _processors_replaced(self) -> bool:
        """Whether some attention module runs another processor than at install."""
        current = [getattr(m, "processor", None) for m in self._modules]
        return any(now is not then for now, then in zip(current, self._processors, strict=True))

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
