"""Install sagevideo's attention into a diffusers CogVideoX transformer, and undo it.

`install(pipe_or_transformer, plan)` swaps known processors (CogVideoX, the Open-Sora port) for
sagevideo's through diffusers' own `attn_processors`/`set_attn_processor`, or intercepts SDPA
inside the forward of dispatcher-based transformers, and returns a handle whose `remove()` puts
everything back (outputs are then bit-identical to never having installed). Installing twice is
an error, not a double wrap. Which attention runs where comes from an `AttentionPlan`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sagevideo.api.attention import BACKENDS
from sagevideo.kernels.plans import PV_MODES
from sagevideo.pipelines.cogvideox import SageCogVideoXAttnProcessor
from sagevideo.pipelines.intercept import SDPAInterception
from sagevideo.pipelines.plans import AttentionPlan
from sagevideo.pipelines.routing import AttentionRouter

_HANDLE_ATTR = "_sagevideo_attention"


class InstalledAttention:
    """What `install` did to one transformer; `remove()` (or leaving a `with` block) undoes it.

    processors: name -> installed processor (empty when SDPA is intercepted instead);
    originals: name -> processor at install time; router: the plan and step clock in use.
    """

    def __init__(
        self,
        transformer: Any,
        originals: dict[str, Any],
        processors: dict[str, Any],
        router: AttentionRouter,
        interception: SDPAInterception | None = None,
    ):
        self.transformer = transformer
        self.originals = originals
        self.processors = processors
        self.router = router
        self.interception = interception
        self.removed = False

    @property
    def layers(self) -> list[str]:
        return list(self.originals)

    @property
    def plan(self) -> AttentionPlan:
        return self.router.plan

    def remove(self) -> None:
        """Restore the original processors. A second call does nothing."""
        if self.removed:
            return
        if self.interception is not None:
            self.interception.remove()
            self._finish()
            return
        current = self.transformer.attn_processors
        replaced = [name for name, proc in self.processors.items() if current.get(name) is not proc]
        if replaced or set(current) != set(self.processors):
            # e.g. fuse_qkv_projections() reinstalled stock processors: restoring ours' originals
            # on top would silently undo the user's change.
            raise RuntimeError(
                f"sagevideo: the attention processors were replaced after install (e.g. "
                f"{(replaced or sorted(set(current) ^ set(self.processors)))[0]}); not restoring"
            )
        self.transformer.set_attn_processor(dict(self.originals))
        self._finish()

    def _finish(self) -> None:
        self.router.clock.detach()
        delattr(self.transformer, _HANDLE_ATTR)
        self.removed = True

    def __enter__(self) -> InstalledAttention:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()

    def __repr__(self) -> str:
        state = "removed" if self.removed else f"{len(self.originals)} layers"
        return f"<InstalledAttention {type(self.transformer).__name__}: {state}>"


def _processor_routes() -> dict[type, type]:
    """Upstream processor class -> sagevideo processor class that keeps its behaviour."""
    from diffusers.models.attention_processor import CogVideoXAttnProcessor2_0

    routes: dict[type, type] = {CogVideoXAttnProcessor2_0: SageCogVideoXAttnProcessor}
    try:
        from sagevideo.pipelines.opensora.attention import OpenSoraAttnProcessor, SageOpenSoraAttnProcessor
    except ImportError:  # the Open-Sora port is optional in older checkouts
        pass
    else:
        routes[OpenSoraAttnProcessor] = SageOpenSoraAttnProcessor
    return routes


def default_plan(transformer: Any, pv: str | None = None) -> AttentionPlan:
    """Uniform plan: `pv` when given; else FP8 PV on GPUs with FP8 tensor cores (sm89+, the fastest
    mode, which meets its accuracy contract on every tested input), 16-bit PV elsewhere."""
    if pv is None:
        import torch

        device = next(transformer.parameters()).device
        fp8 = device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 9)
        pv = "fp8" if fp8 else "fp16"
    return AttentionPlan.uniform(f"int8-{pv}")


def install(
    pipe_or_transformer: Any,
    plan: AttentionPlan | str | Path | None = None,
    *,
    pv: str | None = None,
    backend: str = "auto",
) -> InstalledAttention:
    """Route every attention layer of a diffusers video transformer through `sagevideo.sageattn`.

    pipe_or_transformer: a pipeline with a `.transformer` (step-dependent plans need the pipeline:
    steps are counted on its scheduler), or the transformer itself.
    plan: an `AttentionPlan`, a path to its JSON, or None for `default_plan(transformer, pv)`.
    backend: `sageattn` backend for the quantized layers ("auto", "triton", "reference", "sdpa").
    CogVideoX (and the Open-Sora port) get sagevideo processors that keep the upstream behaviour;
    other transformers with attention processors (diffusers' dispatcher: Wan, HunyuanVideo, LTX,
    Flux...) get a scoped SDPA interception inside their forward. Raises RuntimeError when
    already installed, TypeError for unsupported models, PlanError for a plan that does not fit.
    """
    transformer = getattr(pipe_or_transformer, "transformer", pipe_or_transformer)
    if not hasattr(transformer, "attn_processors") or not hasattr(transformer, "set_attn_processor"):
        raise TypeError(
            f"sagevideo.install: {type(pipe_or_transformer).__name__} is neither a diffusers pipeline with a "
            "transformer nor a diffusers transformer with attention processors"
        )
    if pv is not None and pv not in PV_MODES:
        raise ValueError(f"sagevideo.install: pv={pv!r} is not supported; use one of {PV_MODES}")
    if backend not in BACKENDS:
        raise ValueError(f"sagevideo.install: backend={backend!r} is not supported; use one of {BACKENDS}")
    return install_router(pipe_or_transformer, plan_router(transformer, plan, pv, backend), pv=pv or "fp16",
                          backend=backend)


def plan_router(
    transformer: Any, plan: AttentionPlan | str | Path | None, pv: str | None, backend: str
) -> AttentionRouter:
    """The router for `plan` (an AttentionPlan, a JSON path, or None for `default_plan`)."""
    if plan is not None and not isinstance(plan, AttentionPlan):
        plan = AttentionPlan.load(plan)
    return AttentionRouter(plan if plan is not None else default_plan(transformer, pv), backend)


def install_router(
    pipe_or_transformer: Any,
    router: AttentionRouter,
    *,
    pv: str = "fp16",
    backend: str = "auto",
    routes: dict[type, Any] | None = None,
) -> InstalledAttention:
    """Install with a ready router (e.g. calibration's probing router); see `install`.
    routes: upstream processor class -> factory(pv=, backend=, name=, router=) replacing the
    default mapping (e.g. sequence-parallel processors)."""
    transformer = getattr(pipe_or_transformer, "transformer", pipe_or_transformer)
    if getattr(transformer, _HANDLE_ATTR, None) is not None:
        raise RuntimeError(
            "sagevideo.install: sagevideo attention is already installed on this transformer; "
            "call .remove() on the handle install() returned before installing again"
        )
    originals = transformer.attn_processors
    if not originals:
        raise TypeError(f"sagevideo.install: {type(transformer).__name__} has no attention processors")
    routes = routes or _processor_routes()
    sage_types = tuple(_processor_routes().values())
    for name, proc in originals.items():
        if isinstance(proc, sage_types):
            raise RuntimeError(f"sagevideo.install: {name} already runs sagevideo attention; not wrapping twice")
        if type(proc).__name__.startswith("Fused"):
            raise TypeError(
                f"sagevideo.install: {name} uses {type(proc).__name__}; "
                "after fuse_qkv_projections(), call unfuse_qkv_projections() first"
            )
    layers = {key: key.removesuffix(".processor") for key in originals}
    router.plan.validate_for(list(layers.values()))
    if pipe_or_transformer is not transformer and hasattr(pipe_or_transformer, "scheduler"):
        router.clock.attach(pipe_or_transformer.scheduler)

    if all(type(proc) in routes for proc in originals.values()):
        processors = {
            key: routes[type(proc)](pv=pv, backend=backend, name=layers[key], router=router)
            for key, proc in originals.items()
        }
        transformer.set_attn_processor(dict(processors))
        handle = InstalledAttention(transformer, originals, processors, router)
    else:
        modules = {layers[key]: transformer.get_submodule(layers[key]) for key in originals}
        handle = InstalledAttention(transformer, originals, {}, router, SDPAInterception(transformer, modules, router))
    setattr(transformer, _HANDLE_ATTR, handle)
    return handle
