"""Per-call attention routing: which `sageattn` settings a layer uses at the current step.

`AttentionRouter(plan, backend)` is shared by every sagevideo processor of one installed
transformer. `StepClock` counts denoising steps from the pipeline's scheduler (reset by
`set_timesteps`, advanced after each `step`), outside the transformer, so step-dependent plans
work the same when the transformer is `torch.compile`d. Without a pipeline the step is None and
only step-less plan entries apply.

A plan's block-sparse choices (`plans.Sparse`) are computed through `SparseRouting`
(`pipelines.sparse`): the call's tile mask, chosen eagerly, goes to the attention call as
`tile_mask`; a router whose plan has sparse choices notes every call's layer, step and density,
eagerly and compiled alike (`pipelines.sparse_notes`: each route's statistics on the device, read at
the end of each forward).

Under `torch.compile` nothing a graph reads may change per layer or per step, or Dynamo recompiles
for each: `router.route(layer)` gives each layer a `LayerRoute` whose choice the clock re-resolves
outside the compiled code whenever the step changes, so a graph depends only on the choice
(recompiled when a layer's choice really changes), never on the layer name or the step number.
"""

from __future__ import annotations

import functools
import weakref
from collections import Counter
from typing import Any

import torch

from sagevideo.attention.functional import BACKENDS, key_padding_problem, scaled_dot_product_attention
from sagevideo.attention.sparse import DynamicSelection, KeptTiles, empty_stats
from sagevideo.choices import PVS as PV_MODES
from sagevideo.parallel.balance import balanced_head_order
from sagevideo.pipelines.plans import AttentionPlan, Choice, Mode, Sparse
from sagevideo.pipelines.sparse import SparseRouting
from sagevideo.pipelines.sparse_notes import collect, note_dense, route_key


class StepClock:
    """Denoising step index of the running pipeline call (None when not tracked); `on_change`
    callbacks run after every change (outside any compiled graph: the scheduler calls them).

    `follow(pipe)` counts the steps of whatever scheduler `pipe.scheduler` is when the pipeline
    runs: `sync()`, called before each denoiser forward, moves the clock to a scheduler that
    replaced the one it counted (`pipe.scheduler = X.from_config(...)`), at that scheduler's
    position (`step_index`, 0 before its first step)."""

    def __init__(self) -> None:
        self._step: int | None = None
        self._restore: list[tuple[Any, str]] = []
        self._pipe: Any = None  # weakref.ref to the followed pipeline, or None
        self._scheduler: Any = None
        self.on_change: list[Any] = []

    @property
    def step(self) -> int | None:
        return self._step

    @step.setter
    def step(self, value: int | None) -> None:
        changed = value != self._step
        self._step = value
        if changed:
            for callback in self.on_change:
                callback()

    def follow(self, pipe: Any) -> None:
        """Count the steps of `pipe.scheduler`, and of any scheduler that later replaces it (see `sync`)."""
        self._pipe = weakref.ref(pipe)
        self.attach(pipe.scheduler)

    def sync(self) -> None:
        """Before a denoiser forward: when the followed pipeline's scheduler is not the one counted, count
        that one from its own position instead (its `step_index`; 0 when it has not stepped yet)."""
        pipe = self._pipe() if self._pipe is not None else None
        scheduler = getattr(pipe, "scheduler", None)
        if pipe is None or scheduler is None or scheduler is self._scheduler:
            return
        self._unwrap()
        self.attach(scheduler)
        position = getattr(scheduler, "step_index", None)
        self.step = position if isinstance(position, int) else 0

    def attach(self, scheduler: Any) -> None:
        """Wrap `scheduler.set_timesteps` (step := 0) and `scheduler.step` (step += 1 after)."""
        set_timesteps, step = scheduler.set_timesteps, scheduler.step

        # wraps: pipelines inspect set_timesteps' signature (diffusers' retrieve_timesteps asks whether it
        # takes `sigmas` or `timesteps`; HunyuanVideo passes sigmas): the wrappers keep the scheduler's.
        @functools.wraps(set_timesteps)
        def set_timesteps_and_reset(*args, **kwargs):
            self.step = 0
            return set_timesteps(*args, **kwargs)

        @functools.wraps(step)
        def step_and_advance(*args, **kwargs):
            try:
                return step(*args, **kwargs)
            finally:
                self.step = (self.step or 0) + 1

        scheduler.set_timesteps = set_timesteps_and_reset
        scheduler.step = step_and_advance
        self._scheduler = scheduler
        self._restore = [(scheduler, "set_timesteps"), (scheduler, "step")]

    def _unwrap(self) -> None:
        """Remove the instance-level wrappers (the class methods show through again)."""
        for obj, name in self._restore:
            obj.__dict__.pop(name, None)
        self._restore = []
        self._scheduler = None

    def detach(self) -> None:
        """Stop counting: unwrap the scheduler, forget the pipeline, step None."""
        self._unwrap()
        self._pipe = None
        self.step = None


class LayerRoute:
    """One attention layer as compiled code sees it: its name (for reports and routers that need
    it) and the plan's choice for it at the current step, kept up to date by its router's clock.

    Compiled graphs read only `mode`, `granularity`, `sparse` and `text` (enum members, a frozen
    model and the layer's text position: layers with equal choices share one graph); `name` only outside them (notes).
    `flagged`: the layer's running count of query tiles past
    INT8's accuracy (the run-time guard's, int32 0-dim on the model's device): every quantized
    call adds its count on the device (a graph input like a buffer, so one graph still serves every
    layer); `pipelines.guard` reads the counts at the end of each forward.
    Under a plan with sparse choices, `sparse_stats` (float64 (4,) on the model's device: sum of
    densities, sparse calls, least density, calls on reused lists), which each sparse call adds to on the device,
    `dense_calls` ((reason, planned) -> dense calls, on the host) and `sparse_key` (the route's key,
    int64 0-dim on the CPU, by which a compiled call notes a dense one): `pipelines.sparse_notes`.
    Under a dynamic choice with `reuse_steps`, `reuse` (whether this step's calls attend on kept lists)
    and `kept` (the `KeptTiles` of the running forward's call of the step: guidance may call the
    transformer twice a step) are set outside compiled code, when the clock moves and before each
    forward (`AttentionRouter.advance_routes`, `bind_kept`)."""

    def __init__(self, name: str, choice: Choice):
        self.name = name
        self.mode: Mode = choice.mode
        self.granularity = choice.granularity
        self.sparse: Sparse | None = choice.sparse
        self.text: str | None = None  # its text position for sparse calls (`SparseRouting.text_of`)
        self.flagged = torch.zeros((), dtype=torch.int32)
        self.sparse_stats = empty_stats()
        self.sparse_key = route_key(self)
        self.dense_calls: Counter[tuple[str, bool]] = Counter()
        self.reuse = False
        self.kept = KeptTiles()
        self.kept_by_forward: dict[int, KeptTiles] = {}  # the step's n-th forward -> its lists
        self.run = 0  # steps in a row under the same choice, counted from 0
        self._step: int | None = None

    def counter_on(self, device: torch.device) -> torch.Tensor:
        """`flagged`, moved to `device` first if the model moved (outside compiled code only)."""
        if self.flagged.device != device and not torch.compiler.is_compiling():
            self.flagged = self.flagged.to(device)
        return self.flagged

    def sparse_on(self, device: torch.device) -> torch.Tensor:
        """`sparse_stats`, moved to `device` first if the model moved (outside compiled code only)."""
        if self.sparse_stats.device != device and not torch.compiler.is_compiling():
            self.sparse_stats = self.sparse_stats.to(device)
        return self.sparse_stats

    def set(self, choice: Choice) -> None:
        self.mode, self.granularity, self.sparse = choice.mode, choice.granularity, choice.sparse

    @property
    def reuse_steps(self) -> int | None:
        """The steps one selection serves under the current choice (None: select at every call)."""
        return None if self.sparse is None else self.sparse.reuse_steps  # only dynamic choices take one

    def advance(self, choice: Choice, step: int | None) -> None:
        """The clock moved to `step`, where the plan's choice is `choice` (not yet `set`): count the steps
        in a row under one choice (a step that does not follow the last, or no step, starts afresh), and
        whether this one reuses the lists of the run's last selecting step."""
        same = (choice.mode, choice.granularity, choice.sparse) == (self.mode, self.granularity, self.sparse)
        follows = step is not None and self._step is not None and step == self._step + 1
        self.run = self.run + 1 if same and follows else 0
        self._step = step
        reuse = None if choice.sparse is None else choice.sparse.reuse_steps
        self.reuse = bool(reuse) and self.run % reuse != 0
        if not self.reuse:  # a selecting step makes new lists: the old ones need not stay in memory
            self.kept_by_forward.clear()
            self.kept = KeptTiles()

    def bind_kept(self, forward: int) -> None:
        """Before the step's `forward`-th forward (0 first): its kept lists become `kept`."""
        if self.reuse_steps:
            self.kept = self.kept_by_forward.setdefault(forward, KeptTiles())

    def __repr__(self) -> str:
        return f"LayerRoute({self.name!r}, {self.mode.value}/{self.granularity.value})"


class AttentionRouter:
    """Runs attention for `layer` as the plan says at the clock's current step.

    backend: the `sageattn` backend for quantized modes ("auto", "triton", "reference");
    "full" entries always run SDPA (recorded as requested, not as a fallback). A call whose mask
    the kernels cannot take (the model's own, e.g. HunyuanVideo's token refiner masks queries as
    well as keys) runs SDPA recorded as a fallback with its reason under every backend: an explicit
    backend names the kernel for the calls the kernels can compute; the model's mask does not make
    the run fail.
    sparse: the `SparseRouting` of a plan with block-sparse choices (`install` gives it the layers'
    text positions and the grid of each forward; without them every call runs dense, noted with
    the reason), None for a dense plan.
    """

    def __init__(self, plan: AttentionPlan, backend: str = "auto"):
        self.plan = plan
        self.backend = backend
        self.clock = StepClock()
        self._routes: dict[str, LayerRoute] = {}
        self.forced_full: set[str] = set()  # layers the run-time guard moved to full precision
        self._head_orders: dict[tuple, torch.Tensor | None] = {}  # (densities, world, device) -> `head_order`
        self.clock.on_change.append(self.advance_routes)
        self.sparse = SparseRouting() if plan.uses_sparse else None
        if self.sparse is not None:
            self.sparse.on_forward.append(self.bind_kept)

    def choice(self, layer: str) -> Choice:
        if layer in self.forced_full:
            return Choice(mode=Mode.full)
        return self.plan.choice_for(layer, self.clock.step)

    def head_order(self, layer: str, heads: int, world: int, device: torch.device) -> torch.Tensor | None:
        """The order in which `world` sequence-parallel ranks take `layer`'s `heads` heads at the current
        step (`parallel.ulysses`' `heads`: int64 (heads,) on `device`): balanced by the densities its
        sparse choice measured (`Sparse.head_density`), None for the heads' own order (a dense step, no
        measured densities, or no better balance). ValueError when the plan's densities are for another
        head count."""
        sparse = self.choice(layer).sparse
        if sparse is None or sparse.head_density is None or world == 1:
            return None
        if len(sparse.head_density) != heads:
            raise ValueError(f"plan: layer {layer} lists {len(sparse.head_density)} head densities for its "
                             f"{heads} heads; the plan was made for another model: re-run `sagevideo calibrate`")
        key = (sparse.head_density, world, str(device))
        if key not in self._head_orders:
            order = balanced_head_order(sparse.head_density, world)
            self._head_orders[key] = None if order is None else torch.tensor(order, dtype=torch.int64, device=device)
        return self._head_orders[key]

    @property
    def routes(self) -> dict[str, LayerRoute]:
        """Layer name -> its `LayerRoute`, for every layer routed so far."""
        return self._routes

    def force_full(self, layers: set[str]) -> None:
        """Run `layers` in full precision from now on, whatever the plan says (the guard's strict "full")."""
        self.forced_full |= set(layers)
        self._resolve_routes()

    def route(self, layer: str) -> LayerRoute:
        """The `LayerRoute` of `layer` (one per layer and router), resolved at the current step."""
        route = self._routes.get(layer)
        if route is None:
            route = self._routes[layer] = LayerRoute(layer, self.choice(layer))
            route.text = self._text_of(layer)
        return route

    def _text_of(self, layer: str) -> str | None:
        return None if self.sparse is None else self.sparse.text_of(layer)

    def _resolve_routes(self) -> None:
        for route in self._routes.values():
            route.set(self.choice(route.name))
            route.text = self._text_of(route.name)

    def advance_routes(self) -> None:
        """The clock moved: each route's run of steps under one choice (`LayerRoute.advance`), then its
        choice at the new step; the step's forwards count from 0 again."""
        for route in self._routes.values():
            route.advance(self.choice(route.name), self.clock.step)
        self._resolve_routes()
        if self.sparse is not None:
            self.sparse.forwards = 0

    def bind_kept(self, forward: int) -> None:
        """Before the step's `forward`-th forward (`SparseRouting.forward_started`): each route's kept
        lists for it (outside compiled code; a compiled call reads `route.kept` as a graph input)."""
        for route in self._routes.values():
            route.bind_kept(forward)

    def sparse_layers_changed(self) -> None:
        """Bring the routes' text positions up to date after `sparse.text` changed (install)."""
        self._resolve_routes()

    def attend(
        self, route: LayerRoute, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kwargs
    ) -> torch.Tensor | None:
        """`self(route.name, q, k, v, **kwargs)`, reading the choice from the route (what compiled
        code calls). Routers that override `__call__` (probing, sequence parallel) get their own."""
        if type(self).__call__ is not AttentionRouter.__call__:
            return self(route.name, q, k, v, **kwargs)
        return self._attend_with(route.mode, route.granularity.value, q, k, v, route=route, sparse=route.sparse,
                                 text=route.text, **kwargs)

    def __call__(
        self,
        layer: str,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        *,
        attn_mask: torch.Tensor | None = None,
        is_causal: bool = False,
        sm_scale: float | None = None,
        dropout_p: float = 0.0,
        enable_gqa: bool = False,
    ) -> torch.Tensor:
        """q/k/v (B, H, N, D) -> (B, H, Nq, D), with the plan's setting for `layer`; SDPA's
        semantics for every argument (what the kernels cannot compute runs SDPA, recorded)."""
        choice, route = self.choice(layer), self.route(layer)
        out = self._attend_with(choice.mode, choice.granularity.value, q, k, v, attn_mask=attn_mask,
                                is_causal=is_causal, sm_scale=sm_scale, dropout_p=dropout_p, enable_gqa=enable_gqa,
                                route=route, sparse=choice.sparse, text=self._text_of(layer))
        if self.sparse is not None and not self.sparse.in_forward and not torch.compiler.is_compiling():
            # a call by name outside an installed forward (direct use, probing) is noted at once; inside
            # one (sequence-parallel routers call by name) at its end: no host read per call
            collect([route], self.clock.step)
        return out

    def collect_sparse(self) -> None:
        """Note the calls under a sparse plan since the last collection, per layer, at the current step
        (`sparse_notes.collect`: one device-to-host transfer); nothing for a dense plan. Installed
        models call it at the end of each forward, outside compiled code."""
        if self.sparse is not None:
            collect(list(self._routes.values()), self.clock.step)
            self.sparse.in_forward = False

    def _attend_with(self, mode: Mode, granularity: str, q, k, v, *, route: LayerRoute, attn_mask=None,
                     is_causal=False, sm_scale=None, dropout_p=0.0, enable_gqa=False, sparse: Sparse | None = None,
                     text: str | None = None) -> torch.Tensor:
        tile_mask, kept = self._tile_mask(mode, route, text, sparse, q, k, attn_mask, plain=not dropout_p)
        if mode is Mode.full:  # torch's SDPA on the call as made (sageattn would refuse what SDPA broadcasts)
            return scaled_dot_product_attention(q, k, v, attn_mask, dropout_p, is_causal, sm_scale, enable_gqa,
                                                backend="sdpa")
        backend = self.backend
        if backend in ("triton", "reference") and not dropout_p and key_padding_problem(attn_mask, k.shape[-2]):
            backend = "auto"  # SDPA, recorded with the mask's reason (the kernels' first unmet constraint)
        out = scaled_dot_product_attention(
            q, k, v, attn_mask, dropout_p, is_causal, sm_scale, enable_gqa,
            pv=mode.pv, qk_granularity=granularity, backend=backend, tile_mask=tile_mask,
            _guard_counter=route.counter_on(q.device),
            _sparse_counter=None if tile_mask is None else route.sparse_on(q.device), _kept_tiles=kept,
        )
        return out

    def _tile_mask(self, mode: Mode, route: LayerRoute, text: str | None, sparse: Sparse | None, q, k, attn_mask,
                   plain: bool) -> tuple[Any, KeptTiles | None]:
        """(a sparse call's tile mask (`SparseRouting.call_mask`; `text`: the layer's text position), else
        None; the route's `KeptTiles` where the choice reuses lists over steps, else None), noting
        dense calls under a plan with sparse choices on the route (`sparse_notes.note_dense`, also
        inside a compiled graph: the reason is decided here, on the host). A reusing step's call
        attends on the kept lists where they fit it, else selects afresh (and keeps those)."""
        if self.sparse is None:
            return None, None
        if sparse is None or mode is Mode.full:
            note_dense(route, "", planned=False)
            return None, None
        mask = self.sparse.call_mask(text, sparse, q, k, pv=mode.pv, attn_mask=attn_mask, plain=plain)
        if isinstance(mask, str):  # why this call cannot be sparse: it runs dense
            note_dense(route, mask, planned=True)
            return None, None
        if not (isinstance(mask, DynamicSelection) and route.reuse_steps):
            return mask, None
        kept = route.kept.lists_for(q, k) if route.reuse else None
        return (mask if kept is None else kept), route.kept


def plan_router_of(router: Any) -> Any:
    """The plan's own `AttentionRouter` under the wrappers that delegate to it through `inner` (key
    masks, Ulysses): where its routes, step clock and sparse routing live."""
    while isinstance(getattr(router, "inner", None), AttentionRouter):
        router = router.inner
    return router


class RoutedProcessor:
    """Base of sagevideo's attention processors: the layer name and the router that attends.

    pv: "fp16" or "fp8"; backend: a `sageattn` backend ("auto", "triton", "reference", "sdpa").
    name: the layer name (processor key without ".processor"), used by plans and reports.
    router: the `AttentionRouter` of an installed plan (or any callable router(name, q, k, v, **kw));
    without one, a uniform plan of `pv`. `route`: this layer's `LayerRoute` of an `AttentionRouter`
    (what `call_router` passes it: compiles cleanly), else None.
    """

    def __init__(
        self, *, pv: str = "fp16", backend: str = "auto", name: str = "", router: AttentionRouter | None = None
    ):
        if pv not in PV_MODES:
            raise ValueError(f"pv={pv!r} is not supported; use one of {PV_MODES}")
        if backend not in BACKENDS:
            raise ValueError(f"backend={backend!r} is not supported; use one of {BACKENDS}")
        self.pv = pv
        self.backend = backend
        self.name = name
        self.router = router or AttentionRouter(AttentionPlan.uniform(f"int8-{pv}"), backend)
        self.route = self.router.route(name) if isinstance(self.router, AttentionRouter) else None

    def call_router(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kwargs) -> torch.Tensor:
        """This layer's attention through the router: (B, H, N, D) q/k/v -> (B, H, Nq, D)."""
        if self.route is None:
            return self.router(self.name, q, k, v, **kwargs)
        return self.router.attend(self.route, q, k, v, **kwargs)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, pv={self.pv!r}, backend={self.backend!r})"
