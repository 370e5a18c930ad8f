"""The INT8 contract guarded at run time in an installed model: per layer, per forward.

Every quantized call adds its count of query tiles past INT8's accuracy (`kernels.guard`) to its
layer's device counter (`LayerRoute.flagged`), with no host sync in the call. At the end of each
denoiser forward (outside compiled code) the counters are read in one transfer and each layer's
new count is
- noted in the active `record_backends()` logs (`BackendLog.peaky`, the manifest's
  `backends.peaky`: layer -> query tiles) and warned about once per layer and handle;
- under `guard="full"`: those layers run in full precision from then on and the forward is run
  again, so that its output never carries them quantized;
- under `guard="fail"`: a `PeakyAttentionError` naming the layers stops the job.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

from sagevideo.errors import PeakyAttentionError
from sagevideo.pipelines.routing import AttentionRouter, plan_router_of

GUARD_MODES = ("warn", "full", "fail")


class AttentionGuard:
    """One installed handle's guard: `pre_hook`/`post_hook` go on every denoiser it covers."""

    def __init__(self, router: AttentionRouter, mode: str = "warn", label: str = "transformer"):
        if mode not in GUARD_MODES:
            raise ValueError(f"sagevideo.install: guard={mode!r} is not supported; use one of {GUARD_MODES}")
        self.router = plan_router_of(router)  # wrappers (key masks, Ulysses) delegate choices and routes to it
        self.mode = mode
        self.label = label
        self.read: dict[str, int] = {}  # layer -> its counter's value when last read
        self.flagged: dict[str, int] = {}  # layer -> query tiles flagged so far (every forward)
        self._warned: set[str] = set()

    @torch.compiler.disable  # bookkeeping outside any graph
    def pre_hook(self, module: torch.nn.Module, args: Any) -> None:
        """Counters (the guard's, the sparse statistics) to the model's device before compiled code reads
        them (a model moved after install)."""
        param = next(module.parameters(), None)
        if param is not None:
            for route in self.router.routes.values():
                route.counter_on(param.device)
                route.sparse_on(param.device)

    @torch.compiler.disable
    def post_hook(self, module: torch.nn.Module, args: Any, kwargs: dict, output: Any) -> Any:
        """After a forward: note its block-sparse calls (`AttentionRouter.collect_sparse`), read the new
        counts; under "full" return the forward run again."""
        self.router.collect_sparse()
        new = self.collect()
        if not new:
            return None
        if self.mode == "fail":
            raise PeakyAttentionError(f"sagevideo: attention past INT8's accuracy in {_named(new)} (guard='fail'); "
                                      "run `sagevideo calibrate` for a plan that keeps these layers in full precision")
        if self.mode == "full":
            self.router.force_full(set(new))
            return module(*args, **kwargs)  # its own post_hook reads (and may add) layers again
        return None

    def collect(self) -> dict[str, int]:
        """Layer -> query tiles flagged since the last read (one device-to-host transfer), reported
        to the active logs and warned once per layer. Nothing while a CUDA graph is being captured (no
        host read then: the counts keep adding up on the device, and the next read notes them)."""
        from sagevideo.attention.records import PEAKY_ADVICE, capturing, report_peaky

        routes = list(self.router.routes.values())
        if not routes or capturing():
            return {}
        totals = torch.stack([route.flagged.to(routes[0].flagged.device) for route in routes]).tolist()
        new = {}
        for route, total in zip(routes, totals, strict=True):
            delta = total - self.read.get(route.name, 0)
            self.read[route.name] = total
            if delta > 0:
                new[route.name] = delta
                self.flagged[route.name] = self.flagged.get(route.name, 0) + delta
                report_peaky(route.name, delta)
        fresh = [name for name in new if name not in self._warned]
        if fresh and self.mode == "warn":
            self._warned.update(fresh)
            warnings.warn(f"sagevideo: attention past INT8's accuracy in {_named({n: new[n] for n in fresh})} "
                          f"({PEAKY_ADVICE}; or install with guard='full' to rerun such layers in full precision)",
                          stacklevel=2)
        return new


def _named(counts: dict[str, int]) -> str:
    shown = ", ".join(f"{name} ({tiles} query tiles)" for name, tiles in list(counts.items())[:6])
    return shown + (f" and {len(counts) - 6} more layers" if len(counts) > 6 else "")
