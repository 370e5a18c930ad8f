"""Which attention backend actually ran, readable by callers.

Every `sageattn` call reports one `BackendChoice`. Callers read it in two ways:
- `last_backend()`: the choice of the most recent call in this thread;
- `with record_backends() as log:` collects every call made inside the block (nested blocks
  each see all calls), e.g. to put "what really ran" into a generation manifest.

Recording happens in Python at dispatch time. Inside a graph that torch.compile traces, the
dispatch decision is taken once, while tracing, and the graph holds an effectful op
(`torch.ops.sagevideo.record_backend`) that reports it each time the compiled code runs, so
records describe what the compiled graph calls.

An installed transformer forward whose attention layers ran but routed no call to sagevideo
(e.g. diffusers' "flex" backend, which never calls SDPA) is noted too: `report_unrouted(reason)`,
read back as `BackendLog.unrouted` and, when any, `summary()["unrouted"]`.

The INT8 contract's run-time guard (`kernels.guard`): each quantized call counts, on the device,
its query tiles past INT8's accuracy. The count is read without a host sync in the call:
`BackendChoice.peaky_tiles` reads its call's count when asked; a direct call's count is copied to
pinned memory behind the call and read by the first later call that finds it there (no wait), at
the latest at the end of the `record_backends()` block, and warned about; an installed model's are
read per layer at the end of each forward (`report_peaky`), as `BackendLog.peaky` and
`summary()["peaky"]`.

Installed models running a plan with block-sparse choices also note, per attention call, the layer,
the denoising step, the density that ran (1.0 for a dense call) and why a call the plan made sparse
ran dense (`report_sparse`), read back as `BackendLog.sparse` and `summary()["sparse"]`: per layer
and per step the mean density, and the dense calls' reasons. The notes are made at the end of each
forward from each layer's statistics on the device (`pipelines.sparse_notes`), so compiled models
are noted as eager ones.
"""

from __future__ import annotations

import contextlib
import threading
import warnings
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch


class FlaggedTiles:
    """A call's count of query tiles past INT8's accuracy: a device tensor until read (reading it
    waits for the call, so nothing reads it inside the call), then an int. A direct call's count
    is also copied to pinned host memory without waiting (`start_copy`), readable once `ready`."""

    def __init__(self) -> None:
        self._count: torch.Tensor | int | None = None
        self._copy: tuple[torch.Tensor, Any] | None = None  # (pinned host slot, CUDA event after the copy)

    def set(self, count: torch.Tensor) -> None:
        self._count = count

    def start_copy(self, slot: torch.Tensor) -> None:
        """Copy the device count into `slot` (pinned, int32 0-dim) behind the call, and mark when it lands."""
        if isinstance(self._count, torch.Tensor) and self._count.is_cuda:
            slot.copy_(self._count, non_blocking=True)
            event = torch.cuda.Event()
            event.record()
            self._copy = (slot, event)

    @property
    def ready(self) -> bool:
        """Whether `value` can be read without waiting for the device."""
        if not isinstance(self._count, torch.Tensor) or not self._count.is_cuda:
            return True
        return self._copy is not None and self._copy[1].query()

    @property
    def value(self) -> int | None:
        """The count (None before the call set it); waits for the call if it has not finished."""
        if isinstance(self._count, torch.Tensor):
            if self._copy is not None:
                self._copy[1].synchronize()
                self._count = int(self._copy[0].item())
            else:
                self._count = int(self._count.item())
            self._copy = None
        return self._count


class DeviceDensity:
    """A dynamic call's density (visited / all key tiles) as the call left it: a float64 0-dim tensor
    on the device until read (reading waits for the call, so nothing reads it inside the call), then a
    float."""

    def __init__(self, density: torch.Tensor) -> None:
        self._density: torch.Tensor | float = density

    @property
    def value(self) -> float:
        if isinstance(self._density, torch.Tensor):
            self._density = float(self._density)
        return self._density


@dataclass(frozen=True)
class BackendChoice:
    """One dispatch decision.

    requested: the `backend=` argument ("auto", "triton", "reference", "sdpa").
    ran: the backend that computed the output ("triton", "gluon" (the warp-specialized sm90
    kernel, same numerics as "triton"), "reference", "sdpa").
    pv: PV precision that ran ("fp16", "fp8"), or None for full-precision SDPA.
    reason: why a fallback happened (empty when the requested backend ran).
    flagged: the run-time guard's count for a quantized call (`peaky_tiles`), None for SDPA.
    density: a block-sparse call's tile-mask density (visited / all key tiles; 1.0 ran dense), NaN
    where a compiled graph ran it (reading it there would sync each run), None for dense attention;
    a dynamic call's is read from the device when asked (`DeviceDensity`), not by the call.
    """

    requested: str
    ran: str
    pv: str | None
    reason: str = ""
    flagged: FlaggedTiles | None = field(default=None, compare=False, repr=False)
    _density: float | DeviceDensity | None = None

    @property
    def density(self) -> float | None:
        """The call's density (see the class); reading a dynamic call's waits for the call."""
        return self._density.value if isinstance(self._density, DeviceDensity) else self._density

    @property
    def peaky_tiles(self) -> int | None:
        """Query tiles of this call whose scores were past INT8's accuracy (`kernels.guard`): 0 for a
        call within the contract, None for full-precision SDPA. Reading it waits for the call."""
        return None if self.flagged is None else self.flagged.value

    @property
    def label(self) -> str:
        """Short name such as "triton/fp8" or "sdpa"."""
        return f"{self.ran}/{self.pv}" if self.pv else self.ran

    @property
    def is_fallback(self) -> bool:
        return bool(self.reason)


@dataclass(frozen=True)
class SparseNote:
    """One attention call of an installed model under a plan with block-sparse choices: its layer,
    denoising step (None outside a tracked run), the density that ran (visited / all key tiles; 1.0
    dense) and, for a call its plan made sparse that ran dense, why ('' otherwise). planned: whether
    the plan made the call sparse (False: a step or layer the plan keeps dense); reused: it attended on
    lists kept from an earlier step (`plans.Sparse.reuse_steps`); rank_spread: in a sequence-parallel
    job, the layer's most loaded rank's density over the ranks' mean in that forward (1 = balanced;
    None in one process)."""

    layer: str
    step: int | None
    density: float
    reason: str = ""
    planned: bool = False
    reused: bool = False
    rank_spread: float | None = None


@dataclass
class BackendLog:
    """All choices made inside one `record_backends()` block."""

    choices: list[BackendChoice] = field(default_factory=list)
    unrouted_reasons: list[str] = field(default_factory=list)  # one per forward that routed no call
    peaky: dict[str, int] = field(default_factory=dict)  # layer (or direct call) -> query tiles past INT8
    sparse: list[SparseNote] = field(default_factory=list)  # calls under a plan with sparse choices

    @property
    def counts(self) -> dict[str, int]:
        """Calls per backend label, e.g. {"triton/fp16": 60, "sdpa": 2}."""
        return dict(Counter(c.label for c in self.choices))

    @property
    def fallback_reasons(self) -> dict[str, int]:
        """Fallback reasons with how often each occurred."""
        return dict(Counter(c.reason for c in self.choices if c.reason))

    @property
    def unrouted(self) -> dict[str, int]:
        """Why installed transformer forwards routed no attention call, with how many forwards each."""
        return dict(Counter(self.unrouted_reasons))

    def summary(self) -> dict[str, object]:
        """JSON-ready summary for manifests and reports: counts, fallbacks, "unrouted" (reason ->
        forwards) only when some installed forward routed no attention call, "peaky" (layer ->
        query tiles past INT8's accuracy) only when the run-time guard counted some, and "sparse"
        (`sparse_summary`) only under a plan with block-sparse choices."""
        summary: dict[str, object] = {"counts": self.counts, "fallbacks": self.fallback_reasons}
        if self.unrouted_reasons:
            summary["unrouted"] = self.unrouted
        if self.peaky:
            summary["peaky"] = dict(self.peaky)
        if self.sparse:
            summary["sparse"] = self.sparse_summary()
        return summary

    def sparse_summary(self) -> dict[str, object]:
        """The block-sparse notes in short: "layers" (layer -> {"calls", "density": mean, "min"}, and
        where the plan made calls sparse, "sparse_calls" and "sparse_density" (their mean), and
        "dense" (reason -> those of them that ran dense) when any did, "reused" (calls on lists kept
        from an earlier step) when any were, "rank_spread" (the largest `SparseNote.rank_spread`) in a
        sequence-parallel job), "steps" (step -> mean density
        over its calls; "none" outside a tracked run) and "dense" (reason -> calls the plan made sparse
        that ran dense). Densities rounded to 4 digits."""
        layers: dict[str, list[SparseNote]] = {}
        steps: dict[str, list[float]] = {}
        for note in self.sparse:
            layers.setdefault(note.layer, []).append(note)
            steps.setdefault("none" if note.step is None else str(note.step), []).append(note.density)
        return {
            "layers": {layer: _layer_summary(notes) for layer, notes in layers.items()},
            "steps": {step: _mean(d) for step, d in steps.items()},
            "dense": dict(Counter(note.reason for note in self.sparse if note.reason)),
        }


def _layer_summary(notes: list[SparseNote]) -> dict[str, object]:
    """One layer's entry of `BackendLog.sparse_summary`."""
    densities = [note.density for note in notes]
    entry: dict[str, object] = {"calls": len(notes), "density": _mean(densities), "min": round(min(densities), 4)}
    planned = [note for note in notes if note.planned]
    if planned:
        entry["sparse_calls"] = len(planned)
        entry["sparse_density"] = _mean([note.density for note in planned])
    reasons = Counter(note.reason for note in planned if note.reason)
    if reasons:
        entry["dense"] = dict(reasons)
    reused = sum(note.reused for note in notes)
    if reused:
        entry["reused"] = reused
    spreads = [note.rank_spread for note in notes if note.rank_spread is not None]
    if spreads:
        entry["rank_spread"] = round(max(spreads), 4)
    return entry


def _mean(values: list[float]) -> float:
    return round(sum(values) / len(values), 4)


_state = threading.local()


def _active_logs() -> list[BackendLog]:
    logs = getattr(_state, "logs", None)
    if logs is None:
        logs = _state.logs = []
    return logs


def report(choice: BackendChoice) -> None:
    """Record one dispatch decision (called by `sageattn`); first reads the previous direct calls' guard
    counts that have landed (not while a CUDA graph is being captured: querying an event is not allowed then)."""
    if not capturing():
        read_direct_counts()
    _state.last = choice
    for log in _active_logs():
        log.choices.append(choice)


def note_flagged(count: torch.Tensor, direct: str | None) -> None:
    """Give the call just reported its guard count (int32 0-dim, on the device; not read here).
    direct: the call's description when no installed model reads it ("(2, 4, 1024, 64) int8-fp16"),
    so that it is read at the next call or the end of the `record_backends()` block; None inside an
    installed model (read per layer at the end of the forward)."""
    if torch.compiler.is_compiling():
        torch.ops.sagevideo.note_flagged(count, direct or "")
        return
    choice = getattr(_state, "last", None)
    if choice is None or choice.flagged is None:
        return
    choice.flagged.set(count)
    # A call captured in a CUDA graph writes its count on each replay, where no host code runs: nothing
    # is copied or queued for it (the choice's `flagged` reads the last replay's count when asked).
    if direct and not capturing():
        pending = _pending_direct()
        if len(pending) >= _PINNED_SLOTS:  # the ring's oldest slot is still unread: read it first
            read_direct_counts(wait_for=1)
        choice.flagged.start_copy(_pinned_slot())
        pending.append((choice, direct))


def capturing() -> bool:
    """Whether the current CUDA stream is capturing a graph (False where CUDA is not initialized)."""
    return torch.cuda.is_initialized() and torch.cuda.is_current_stream_capturing()


_PINNED_SLOTS = 256


def _pinned_slot() -> torch.Tensor:
    """The next slot of a ring of pinned int32 counters (one allocation a thread): a direct call's count
    lands there without a host sync."""
    ring = getattr(_state, "ring", None)
    if ring is None:
        pin = torch.cuda.is_available()
        ring = _state.ring = [torch.zeros(_PINNED_SLOTS, dtype=torch.int32, pin_memory=pin), 0]
    slots, index = ring
    ring[1] = (index + 1) % _PINNED_SLOTS
    return slots[index]


@torch.library.custom_op("sagevideo::note_flagged", mutates_args=())
def _note_flagged_op(count: torch.Tensor, direct: str) -> None:
    note_flagged(count, direct or None)


@_note_flagged_op.register_fake
def _(count: torch.Tensor, direct: str) -> None:
    return None


def _pending_direct() -> list[tuple[BackendChoice, str]]:
    pending = getattr(_state, "pending", None)
    if pending is None:
        pending = _state.pending = []
    return pending


_peaky_warned: set[str] = set()


def read_direct_counts(wait_for: int = 0) -> None:
    """Read the guard counts of direct calls that have finished (never waiting for the device, but for
    the oldest `wait_for` ones; -1: all); note flagged ones in the active logs, warn once per kind of call."""
    pending = _pending_direct()
    while pending:
        choice, direct = pending[0]
        if not (wait_for or choice.flagged.ready):
            return
        wait_for -= wait_for > 0
        pending.pop(0)
        tiles = choice.peaky_tiles
        if tiles:
            report_peaky(f"sageattn {direct}", tiles)
            if direct not in _peaky_warned:
                _peaky_warned.add(direct)
                warnings.warn(f"sageattn: a call {direct} is past INT8's accuracy: {tiles} query tile(s) with "
                              f"scores too peaky for INT8 ({PEAKY_ADVICE})", stacklevel=3)


PEAKY_ADVICE = ("expect a worst cosine below the contract's 0.999/0.998 against full precision; run such "
                "attention with backend='sdpa', or let `sagevideo calibrate` keep the layer in full precision")


def report_sparse(note: SparseNote) -> None:
    """Note one call of an installed model under a sparse plan in the active logs (outside compiled code)."""
    for log in _active_logs():
        log.sparse.append(note)


def report_peaky(where: str, tiles: int) -> None:
    """Note `tiles` query tiles past INT8's accuracy in `where` (a layer, or a direct call) in the active logs."""
    for log in _active_logs():
        log.peaky[where] = log.peaky.get(where, 0) + tiles


_warned: set[str] = set()


def warn_fallback_once(reason: str) -> None:
    """Warn once a process for each fallback reason (a `sageattn` call that ran full-precision SDPA)."""
    if reason and reason not in _warned:
        _warned.add(reason)
        warnings.warn(f"sageattn: running full-precision SDPA: {reason}", stacklevel=4)


@torch.library.custom_op("sagevideo::record_backend", mutates_args=())
def _record_backend_op(requested: str, ran: str, pv: str, reason: str, density: float = -1.0) -> None:
    # Runs each time the compiled graph does: the warning is given here, at run time, because a
    # warnings.warn while Dynamo traces would break the graph. density -1: dense attention.
    report(BackendChoice(requested, ran, pv or None, reason, FlaggedTiles() if ran != "sdpa" else None,
                         None if density == -1.0 else density))
    warn_fallback_once(reason)


@_record_backend_op.register_fake
def _(requested: str, ran: str, pv: str, reason: str, density: float = -1.0) -> None:
    return None


def register_effect(name: str) -> None:
    """Mark the op `sagevideo::<name>` as a side effect, so that AOT autograd and Inductor keep it
    (an op with no outputs is otherwise dead code) and order it; the API moved between torch releases."""
    try:
        from torch.library import EffectType, _register_effectful_op

        _register_effectful_op(f"sagevideo::{name}", EffectType.ORDERED)
    except ImportError:
        from torch._higher_order_ops.effects import _EffectType, _register_effectful_op

        _register_effectful_op(getattr(torch.ops.sagevideo, name).default, _EffectType.ORDERED)


register_effect("record_backend")
register_effect("note_flagged")


# How Inductor's cacheability check names torch's with_effects operator, which holds the record op
# in a compiled graph.
WITH_EFFECTS = "torch.ops.higher_order.with_effects"


def allow_caching_graphs_with_records() -> None:
    """Let Inductor's FX-graph cache keep graphs that hold the record op. The op is effectful, so
    such graphs carry torch's with_effects operator, which the cache refuses unless it is marked:
    every process then compiled them again, however warm the cache. The op only reports which
    kernel ran, and the cached code still calls it on each run, so those graphs are safe to cache.
    Keyed by torch's version, as torch's own example of the setting is; a user's entries are kept."""
    import torch._inductor.config as inductor_config

    marked = dict(inductor_config.unsafe_marked_cacheable_functions)
    marked.setdefault(WITH_EFFECTS, torch.__version__)
    inductor_config.unsafe_marked_cacheable_functions = marked


def report_from_graph(requested: str, ran: str, pv: str | None, reason: str, density: float | None = None) -> None:
    """`report`, called while torch.compile traces: puts the reporting op into the graph."""
    torch.ops.sagevideo.record_backend(requested, ran, pv or "", reason, -1.0 if density is None else density)


def report_unrouted(reason: str) -> None:
    """Note that an installed transformer forward routed no attention call, and why (called by the
    SDPA interception)."""
    for log in _active_logs():
        log.unrouted_reasons.append(reason)


def last_backend() -> BackendChoice | None:
    """The backend choice of the most recent `sageattn` call in this thread, or None (its
    `peaky_tiles` reads the call's guard count)."""
    return getattr(_state, "last", None)


@contextlib.contextmanager
def record_backends() -> Iterator[BackendLog]:
    """Collect the backend choice of every `sageattn` call made inside the block."""
    log = BackendLog()
    logs = _active_logs()
    logs.append(log)
    try:
        yield log
    finally:
        read_direct_counts(wait_for=-1)
        logs.remove(log)
