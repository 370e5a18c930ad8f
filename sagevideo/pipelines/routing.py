"""Per-call attention routing: which `sageattn` settings a layer uses at the current step.

`AttentionRouter(plan, backend)` is shared by every sagevideo processor of one installed
transformer. `StepClock` counts denoising steps from the pipeline's scheduler (reset by
`set_timesteps`, advanced after each `step`), outside the transformer, so step-dependent plans
work the same when the transformer is `torch.compile`d. Without a pipeline the step is None and
only step-less plan entries apply.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from sagevideo.attention.functional import BACKENDS, sageattn, scaled_dot_product_attention
from sagevideo.choices import PVS as PV_MODES
from sagevideo.pipelines.plans import AttentionPlan, Choice, Mode


class StepClock:
    """Denoising step index of the running pipeline call (None when not tracked)."""

    def __init__(self) -> None:
        self.step: int | None = None
        self._restore: list[tuple[Any, str]] = []

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
        self._restore = [(scheduler, "set_timesteps"), (scheduler, "step")]

    def detach(self) -> None:
        """Remove the instance-level wrappers (the class methods show through again)."""
        for obj, name in self._restore:
            obj.__dict__.pop(name, None)
        self._restore = []
        self.step = None


class AttentionRouter:
    """Runs attention for `layer` as the plan says at the clock's current step.

    backend: the `sageattn` backend for quantized modes ("auto", "triton", "reference");
    "full" entries always run SDPA (recorded as requested, not as a fallback).
    """

    def __init__(self, plan: AttentionPlan, backend: str = "auto"):
        self.plan = plan
        self.backend = backend
        self.clock = StepClock()

    def choice(self, layer: str) -> Choice:
        return self.plan.choice_for(layer, self.clock.step)

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
        choice = self.choice(layer)
        if choice.mode is Mode.full:
            if dropout_p:
                return scaled_dot_product_attention(q, k, v, attn_mask, dropout_p, is_causal, sm_scale, enable_gqa,
                                                    backend="sdpa")
            return sageattn(q, k, v, attn_mask=attn_mask, is_causal=is_causal, sm_scale=sm_scale, backend="sdpa",
                            enable_gqa=enable_gqa)
        return scaled_dot_product_attention(
            q, k, v, attn_mask, dropout_p, is_causal, sm_scale, enable_gqa,
            pv=choice.mode.pv, qk_granularity=choice.granularity.value, backend=self.backend,
        )


class RoutedProcessor:
    """Base of sagevideo's attention processors: the layer name and the router that attends.

    pv: "fp16" or "fp8"; backend: a `sageattn` backend ("auto", "triton", "reference", "sdpa").
    name: the layer name (processor key without ".processor"), used by plans and reports.
    router: the `AttentionRouter` of an installed plan; without one, a uniform plan of `pv`.
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

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, pv={self.pv!r}, backend={self.backend!r})"
