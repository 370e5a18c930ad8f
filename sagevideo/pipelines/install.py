"""Install sagevideo's attention into a diffusers video transformer, and undo it.

`install(pipe_or_transformer, plan)` swaps known processors (each model family's attention
routes, `sagevideo.pipelines.families`: CogVideoX, the Open-Sora port) for sagevideo's through
diffusers' own `attn_processors`/`set_attn_processor`, or intercepts SDPA inside the forward of
dispatcher-based transformers (and of models without diffusers' AttentionMixin whose attention
modules hold SDPA-calling processors: Framepack, Latte, EasyAnimate), and returns a handle whose
`remove()` puts everything back (outputs are then bit-identical to never having installed). Installing twice is
an error, not a double wrap. Which attention runs where comes from an `AttentionPlan`.
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from sagevideo.attention.functional import BACKENDS
from sagevideo.attention.records import allow_caching_graphs_with_records
from sagevideo.choices import PVS as PV_MODES
from sagevideo.choices import auto_pv
from sagevideo.pipelines.compiled import compiled_parts, retrace_compiled, unwrap_compiled
from sagevideo.pipelines.guard import AttentionGuard
from sagevideo.pipelines.intercept import SDPAInterception, UnroutedForwards, non_sdpa_backend_advice
from sagevideo.pipelines.plans import AttentionPlan, PlanError
from sagevideo.pipelines.routing import AttentionRouter

_HANDLE_ATTR = "_sagevideo_attention"

# Pipeline components that denoise: diffusers names them `transformer`, and Wan 2.2 adds
# `transformer_2` (low-noise steps below `boundary_ratio`). install() covers every one of them.
_TRANSFORMER_COMPONENT = re.compile(r"transformer(_\w+)?")
# Denoising components install() does not cover: a pipeline holding one is refused, since its
# attention would run stock while the manifest says sagevideo ran.
_OTHER_DENOISER_COMPONENT = re.compile(r"(unet|controlnet|prior|prior_prior|decoder)(_\w+)?")


@dataclass
class InstalledDenoiser:
    """What `install` did to one denoiser of a pipeline.

    component: its pipeline component name ("transformer", "transformer_2"); prefix: what its layer
    names carry in plans and records ("" for `transformer`, "transformer_2." for `transformer_2`);
    originals: processor key -> processor at install time; processors: processor key -> installed
    processor (empty when SDPA is intercepted instead).
    """

    component: str
    transformer: Any
    prefix: str
    originals: dict[str, Any]
    processors: dict[str, Any] = field(default_factory=dict)
    interception: SDPAInterception | None = None
    hooks: list[Any] = field(default_factory=list)  # sagevideo's own hook handles on the transformer
    label: str = "transformer"  # its name in messages ("pipe.transformer_2")
    wrapped: bool = False  # it came inside a torch.compile wrapper


class InstalledAttention:
    """What `install` did to a pipeline's denoisers; `remove()` (or leaving a `with` block) undoes it all.

    denoisers: one `InstalledDenoiser` per transformer, `transformer` first; router: the plan and
    step clock they share. `originals`/`processors`/`layers` span every denoiser, keyed by
    prefixed processor key; `transformer`/`interception` are the first denoiser's.
    """

    def __init__(self, denoisers: list[InstalledDenoiser], router: AttentionRouter, guard: AttentionGuard):
        self.denoisers = denoisers
        self.router = router
        self.guard = guard
        self.removed = False

    @property
    def peaky(self) -> dict[str, int]:
        """Layer -> query tiles the run-time guard found past INT8's accuracy, over every forward so far."""
        return dict(self.guard.flagged)

    @property
    def transformer(self) -> Any:
        return self.denoisers[0].transformer

    @property
    def interception(self) -> SDPAInterception | None:
        return self.denoisers[0].interception

    @property
    def originals(self) -> dict[str, Any]:
        return {d.prefix + key: proc for d in self.denoisers for key, proc in d.originals.items()}

    @property
    def processors(self) -> dict[str, Any]:
        return {d.prefix + key: proc for d in self.denoisers for key, proc in d.processors.items()}

    @property
    def layers(self) -> list[str]:
        return list(self.originals)

    @property
    def plan(self) -> AttentionPlan:
        return self.router.plan

    def remove(self) -> None:
        """Restore every denoiser's original processors and hooks. A second call does nothing.
        Raises RuntimeError (restoring nothing) when sagevideo's processors were replaced since."""
        if self.removed:
            return
        for d in self.denoisers:
            if d.interception is not None:
                continue
            current = d.transformer.attn_processors
            replaced = [name for name, proc in d.processors.items() if current.get(name) is not proc]
            if replaced or set(current) != set(d.processors):
                # e.g. fuse_qkv_projections() reinstalled stock processors: restoring ours' originals
                # on top would silently undo the user's change.
                raise RuntimeError(
                    f"sagevideo: the attention processors were replaced after install (e.g. {d.prefix}"
                    f"{(replaced or sorted(set(current) ^ set(d.processors)))[0]}); not restoring"
                )
        for d in self.denoisers:
            _undo(d)
        _retrace_if_compiled(self.denoisers, "remove")
        self._finish()

    def _finish(self) -> None:
        self.router.clock.detach()
        for d in self.denoisers:
            delattr(d.transformer, _HANDLE_ATTR)
        self.removed = True

    def __enter__(self) -> InstalledAttention:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()

    def __repr__(self) -> str:
        names = "+".join(type(d.transformer).__name__ for d in self.denoisers)
        state = "removed" if self.removed else f"{len(self.originals)} layers"
        return f"<InstalledAttention {names}: {state}>"


def _undo(denoiser: InstalledDenoiser) -> None:
    for hook in denoiser.hooks:
        hook.remove()
    denoiser.hooks = []
    if denoiser.interception is not None:
        denoiser.interception.remove()
    else:
        denoiser.transformer.set_attn_processor(dict(denoiser.originals))


def _retrace_if_compiled(denoisers: list[InstalledDenoiser], action: str) -> None:
    """After hooks or processors changed: make code torch.compile traced before trace again."""
    found = [(d.label, parts) for d in denoisers if (parts := compiled_parts(d.transformer, d.wrapped))]
    if found:
        retrace_compiled(found[0][0], [part for _, parts in found for part in parts], action)


def _pipeline_modules(pipe: Any) -> dict[str, Any] | None:
    """Registered module name -> module of a diffusers pipeline (None for anything else). Read
    from the config rather than `pipe.components`, which raises when modules were registered
    beyond the constructor's arguments."""
    config = getattr(pipe, "config", None)
    if not hasattr(pipe, "register_modules") or config is None:
        return None
    # vars(), not getattr: a config value such as WanPipeline's boundary_ratio is no module, and
    # reading it as an attribute raises diffusers' deprecation warning.
    modules = {name: vars(pipe).get(name) for name in config.keys() if not name.startswith("_")}
    return {name: module for name, module in modules.items() if isinstance(module, torch.nn.Module)}


def _held_modules(holder: Any) -> dict[str, Any] | None:
    """Attribute name -> module of an object that holds a `.transformer` but is no diffusers pipeline
    (e.g. a user's container of a pipeline's parts), as `_pipeline_modules` gives a pipeline's:
    `transformer` and every other denoiser-named model it holds (`transformer_2`...); None for anything
    else. Models only (a `config`): a `transformer_blocks` list is no denoiser."""
    if _pipeline_modules(holder) is not None or not hasattr(holder, "transformer"):
        return None
    names = [name for name in dir(holder) if name != "transformer" and (
        _TRANSFORMER_COMPONENT.fullmatch(name) or _OTHER_DENOISER_COMPONENT.fullmatch(name))]
    modules = {name: getattr(holder, name, None) for name in names}
    held = {name: m for name, m in modules.items() if isinstance(m, torch.nn.Module) and hasattr(m, "config")}
    return {"transformer": holder.transformer, **held}


def denoisers_of(pipe_or_transformer: Any) -> dict[str, Any]:
    """Component name -> denoiser that `install` covers, `transformer` first: every `transformer*`
    component of a diffusers pipeline (Wan 2.2: `transformer` and `transformer_2`) or of an object
    holding a `.transformer` that is no pipeline (its `transformer*` models), or {"transformer": x}
    for a transformer x.

    Raises TypeError for a pipeline (or holder) that also denoises with a component sagevideo does
    not install into (a ControlNet, a UNet...).
    """
    modules = _pipeline_modules(pipe_or_transformer)
    if modules is None:
        modules = _held_modules(pipe_or_transformer)
    if modules is None:
        return {"transformer": unwrap_compiled(pipe_or_transformer)}
    found = {name: unwrap_compiled(module) for name, module in modules.items()
             if _TRANSFORMER_COMPONENT.fullmatch(name)}
    others = sorted(
        name for name, module in modules.items()
        if _OTHER_DENOISER_COMPONENT.fullmatch(name) and hasattr(module, "attn_processors")
    )
    if found and others:
        raise TypeError(
            f"sagevideo.install: {type(pipe_or_transformer).__name__} also runs attention in {', '.join(others)}, "
            "which sagevideo does not install into (it would run stock attention unrecorded); to quantize only "
            "the transformer, pass it: install(pipe.transformer) (step-dependent plans then have no step clock)"
        )
    if not found:
        return {"transformer": pipe_or_transformer}  # not a transformer pipeline: install() says so
    return dict(sorted(found.items(), key=lambda item: (item[0] != "transformer", item[0])))


def attention_processors(transformer: Any) -> dict[str, Any]:
    """Processor key ("blocks.0.attn1.processor") -> processor of every attention module: diffusers'
    `attn_processors`, or for a model without diffusers' AttentionMixin (HunyuanVideo-Framepack,
    Latte, EasyAnimate in diffusers 0.42) the same walk over its modules that holds one."""
    if hasattr(transformer, "attn_processors"):
        return transformer.attn_processors
    return {f"{name}.processor": module.get_processor() for name, module in transformer.named_modules()
            if hasattr(module, "get_processor")}


def _processor_routes() -> dict[type, type]:
    """Upstream processor class -> sagevideo processor class that keeps its behaviour: every
    registered model family's routes (`sagevideo.pipelines.families`)."""
    from sagevideo.pipelines.families import processor_routes

    return processor_routes()


def default_plan(transformer: Any, pv: str | None = None) -> AttentionPlan:
    """Uniform plan: `pv` when given; else FP8 PV on GPUs with FP8 tensor cores (sm89+, the fastest
    mode, which meets its accuracy contract on every tested input), 16-bit PV elsewhere."""
    if pv is None:
        pv = auto_pv(next(transformer.parameters()).device)
    return AttentionPlan.uniform(f"int8-{pv}")


def install(
    pipe_or_transformer: Any,
    plan: AttentionPlan | str | Path | None = None,
    *,
    pv: str | None = None,
    backend: str = "auto",
    guard: str = "warn",
) -> InstalledAttention:
    """Route every attention layer of a diffusers video pipeline's denoisers through `sagevideo.sageattn`.

    pipe_or_transformer: a pipeline (step-dependent plans need it: steps are counted on its
    scheduler), or a transformer itself. A pipeline gets it in every denoiser it holds
    (`transformer`, and `transformer_2` of Wan 2.2); layers of `transformer` keep their names,
    those of another denoiser are prefixed with its component name ("transformer_2.blocks.0.attn1").
    plan: an `AttentionPlan` (over the layers of all denoisers), a path to its JSON, or None for
    `default_plan(transformer, pv)`.
    backend: `sageattn` backend for the quantized layers ("auto", "triton", "reference", "sdpa").
    guard: what the INT8 contract's run-time guard does with a layer whose attention it finds past
    INT8's accuracy (read at the end of each forward, `pipelines.guard`): "warn" (recorded, warned
    once per layer), "full" (the layer runs in full precision from then on; the forward runs again),
    "fail" (`PeakyAttentionError`).
    CogVideoX (and the Open-Sora port) get sagevideo processors that keep the upstream behaviour;
    other transformers with attention processors (diffusers' dispatcher: Wan, HunyuanVideo, LTX,
    Flux...) get a scoped SDPA interception inside their forward. Raises RuntimeError when
    already installed, TypeError for unsupported models, PlanError for a plan that does not fit.
    """
    found = denoisers_of(pipe_or_transformer)
    for transformer in found.values():
        if not isinstance(transformer, torch.nn.Module) or not attention_processors(transformer):
            raise TypeError(
                f"sagevideo.install: {type(pipe_or_transformer).__name__} is neither a diffusers pipeline with a "
                "transformer nor a diffusers transformer with attention processors"
            )
    if pv is not None and pv not in PV_MODES:
        raise ValueError(f"sagevideo.install: pv={pv!r} is not supported; use one of {PV_MODES}")
    if backend not in BACKENDS:
        raise ValueError(f"sagevideo.install: backend={backend!r} is not supported; use one of {BACKENDS}")
    _warn_if_sdpa_replaced()
    first = next(iter(found.values()))
    return install_router(pipe_or_transformer, plan_router(first, plan, pv, backend), pv=pv or "fp16",
                          backend=backend, guard=guard)


def _warn_if_sdpa_replaced() -> None:
    """A process-wide `F.scaled_dot_product_attention = ...` (SageAttention's idiom) takes the model's calls
    before any interception can see them: the plan would not apply where the model calls F's SDPA."""
    import torch.nn.functional as F

    from sagevideo.attention.functional import TORCH_SDPA

    if F.scaled_dot_product_attention is not TORCH_SDPA:
        warnings.warn(
            "sagevideo.install: torch.nn.functional.scaled_dot_product_attention was replaced (by "
            f"{getattr(F.scaled_dot_product_attention, '__module__', '?')}); model code calling it bypasses the "
            "installed plan and its records; restore torch's own before install (install() needs no replacement)",
            stacklevel=3,
        )


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
    guard: str = "warn",
) -> InstalledAttention:
    """Install with a ready router (e.g. calibration's probing router) into every denoiser; see `install`.
    routes: upstream processor class -> factory(pv=, backend=, name=, router=) replacing the
    default mapping (e.g. sequence-parallel processors). Everything is checked before anything changes."""
    routes = routes or _processor_routes()
    is_pipeline = _pipeline_modules(pipe_or_transformer) is not None or _held_modules(pipe_or_transformer) is not None
    planned: list[tuple[InstalledDenoiser, dict[str, str]]] = []  # (denoiser, processor key -> layer name)
    seen: set[int] = set()
    for component, transformer in denoisers_of(pipe_or_transformer).items():
        if id(transformer) in seen:  # one module registered under two names: installed once
            continue
        seen.add(id(transformer))
        prefix = "" if component == "transformer" else f"{component}."
        originals = _check_installable(transformer, prefix)
        layers = {key: prefix + key.removesuffix(".processor") for key in originals}
        label = f"pipe.{component}" if is_pipeline else "transformer"
        given = getattr(pipe_or_transformer, component, pipe_or_transformer)
        wrapped = given is not transformer and unwrap_compiled(given) is transformer
        planned.append((InstalledDenoiser(component, transformer, prefix, originals, label=label, wrapped=wrapped),
                        layers))
    router.plan.validate_for([name for _, layers in planned for name in layers.values()])
    _check_head_densities(router.plan, planned)
    grids = _sparse_grids(router, planned)
    router = _with_key_padding(router, planned)

    handle = InstalledAttention([d for d, _ in planned], router, AttentionGuard(router, guard))
    unrouted = UnroutedForwards()  # one warning per handle, whichever denoiser routes nothing
    done: list[InstalledDenoiser] = []
    try:
        for denoiser, layers in planned:
            _apply(denoiser, layers, router, routes, pv, backend, denoiser.label, unrouted)
            done.append(denoiser)
    except BaseException:
        for denoiser in done:  # leave nothing half-installed
            _undo(denoiser)
        raise
    if all(d.transformer is not pipe_or_transformer for d in handle.denoisers) and hasattr(
        pipe_or_transformer, "scheduler"
    ):
        # One clock for all denoisers, counting the steps of the scheduler the pipeline holds when it runs.
        router.clock.follow(pipe_or_transformer)
        for denoiser in handle.denoisers:
            denoiser.hooks.append(denoiser.transformer.register_forward_pre_hook(_ClockSync(router.clock)))
    for denoiser, hook in grids:
        denoiser.hooks.append(denoiser.transformer.register_forward_pre_hook(hook, with_kwargs=True))
    for denoiser in handle.denoisers:
        denoiser.hooks.append(denoiser.transformer.register_forward_pre_hook(handle.guard.pre_hook))
        denoiser.hooks.append(denoiser.transformer.register_forward_hook(handle.guard.post_hook, with_kwargs=True))
    for denoiser in handle.denoisers:
        setattr(denoiser.transformer, _HANDLE_ATTR, handle)
    _retrace_if_compiled(handle.denoisers, "install")
    allow_caching_graphs_with_records()  # a user who compiles the model gets torch's compile cache
    return handle


class _ClockSync:
    """Forward pre-hook of a denoiser: the step clock follows a scheduler swapped into the pipeline."""

    def __init__(self, clock: Any):
        self.clock = clock

    @torch.compiler.disable  # bookkeeping outside any graph: a compiled model calls it eagerly
    def __call__(self, module: Any, args: Any) -> None:
        self.clock.sync()


def _sparse_grids(router: AttentionRouter, planned: list[tuple[InstalledDenoiser, dict[str, str]]]) -> list:
    """For a plan with block-sparse choices: the sparse layers' text positions into the router's
    `SparseRouting`, and (denoiser, `GridHook`) for each denoiser whose family declares a layout
    (`families.sparse_layout`); [] for a dense plan (nothing is added)."""
    from sagevideo.pipelines.families import sparse_layout
    from sagevideo.pipelines.routing import plan_router_of
    from sagevideo.pipelines.sparse import GridHook

    router = plan_router_of(router)  # a wrapper's (Ulysses) calls read the plan's own router's routing
    if getattr(router, "sparse", None) is None:
        return []
    hooks = []
    for denoiser, _ in planned:
        layout = sparse_layout(denoiser.transformer)
        if layout is not None:
            router.sparse.text.update({denoiser.prefix + name: text for name, text in layout.text.items()})
            hooks.append((denoiser, GridHook(router.sparse, layout)))
    router.sparse_layers_changed()
    return hooks


def _with_key_padding(router: AttentionRouter, planned: list[tuple[InstalledDenoiser, dict[str, str]]]) -> Any:
    """`router`, reading back as key masks the materialized masks of the layers their families know
    to be key padding (`families.key_padding_layers`, `pipelines.masks`); as it is when there are none."""
    from sagevideo.pipelines.families import key_padding_layers
    from sagevideo.pipelines.masks import KeyPaddingRouter

    forms = {d.prefix + name: form for d, _ in planned for name, form in key_padding_layers(d.transformer).items()}
    return KeyPaddingRouter(router, forms) if forms else router


def _check_head_densities(plan: AttentionPlan, planned: list[tuple[InstalledDenoiser, dict[str, str]]]) -> None:
    """PlanError when a sparse choice's per-head densities do not match its layers' head counts (a plan
    for another model), before anything changes; layers whose module has no `heads` are left out."""
    layer_heads = {}
    for denoiser, layers in planned:
        for key, name in layers.items():
            try:
                heads = getattr(denoiser.transformer.get_submodule(key.removesuffix(".processor")), "heads", None)
            except AttributeError:  # a processor key that names no module
                heads = None
            if isinstance(heads, int):
                layer_heads[name] = heads
    problems = plan.head_problems(layer_heads)
    if problems:
        raise PlanError("; ".join(problems))


def _check_installable(transformer: Any, prefix: str) -> dict[str, Any]:
    """The transformer's processors (key -> processor), or a clear error why sagevideo cannot take them over."""
    if getattr(transformer, _HANDLE_ATTR, None) is not None:
        raise RuntimeError(
            "sagevideo.install: sagevideo attention is already installed on this transformer; "
            "call .remove() on the handle install() returned before installing again"
        )
    originals = attention_processors(transformer)
    if not originals:
        raise TypeError(f"sagevideo.install: {type(transformer).__name__} has no attention processors")
    sage_types = tuple(_processor_routes().values())
    for name, proc in originals.items():
        if isinstance(proc, sage_types):
            raise RuntimeError(
                f"sagevideo.install: {prefix}{name} already runs sagevideo attention; not wrapping twice"
            )
        if type(proc).__name__.startswith("Fused"):
            raise TypeError(
                f"sagevideo.install: {prefix}{name} uses {type(proc).__name__}; "
                "after fuse_qkv_projections(), call unfuse_qkv_projections() first"
            )
    return originals


def _apply(
    denoiser: InstalledDenoiser, layers: dict[str, str], router: AttentionRouter, routes: dict[type, Any],
    pv: str, backend: str, label: str, unrouted: UnroutedForwards,
) -> None:
    """Swap in sagevideo processors when every processor has a route, else intercept SDPA in the
    forward (warning now when diffusers' dispatcher is set to a backend that never calls SDPA)."""
    transformer, originals = denoiser.transformer, denoiser.originals
    if hasattr(transformer, "set_attn_processor") and all(type(proc) in routes for proc in originals.values()):
        denoiser.processors = {
            key: routes[type(proc)](pv=pv, backend=backend, name=layers[key], router=router)
            for key, proc in originals.items()
        }
        transformer.set_attn_processor(dict(denoiser.processors))
    else:
        modules = {layers[key]: transformer.get_submodule(key.removesuffix(".processor")) for key in originals}
        advice = non_sdpa_backend_advice(label, modules.values())
        if advice is not None:
            warnings.warn(f"sagevideo.install: {advice}", stacklevel=4)
        denoiser.interception = SDPAInterception(transformer, modules, router, label=label, unrouted=unrouted)
