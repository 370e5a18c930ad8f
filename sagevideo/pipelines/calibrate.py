"""Calibration: measure every attention layer's error per mode on real prompts, write a plan.

The SageAttention paper's adaptive selection (§4.5), as a tool. A probing router is installed
in place of the plan router: every attention call returns full-precision SDPA (so the run is the
full-precision run), and at the captured steps it also runs each candidate mode on the same
Q/K/V and compares it with an fp32 reference, keeping the worst over heads, calls and steps.
The plan then picks, per layer, the fastest candidate whose worst cosine meets the threshold,
and full precision where none does.

Block-sparse proposals (`sparse_ladder`, docs/sparse.md stage 4b): given a `--sparse` setting, at
the captured steps the plan would run sparse (from `dense_steps(steps)` on) the router also selects
each layer's tiles at a small ladder of densities (the given one, then 2x and 4x denser) and runs
every candidate mode on them, comparing each with the same mode's dense output on the same Q/K/V:
the error sparsity adds. Per layer, on the mode chosen for it, the sparsest density whose worst
cosine meets the budget (`DEFAULT_SPARSE_BUDGET` unless given) is proposed; a layer that meets it
at no density, that its family never makes sparse, or a denoiser's first sparse layer stays dense.

Dynamic selection is proposed as a calibrated top_p per layer and ladder density (`Sparse.top_p`:
one top_p per call adapts to each query tile, where a per-row density gives each the same count),
in two passes over the same prompts and seeds (the probe returns full-precision attention, so the
second pass sees the calls of the first):
1. the probing router keeps, per layer and P·V mode (the tiles differ), the mean over the captured
   calls of the density each top_p on a grid of `TOP_P_STEPS` reaches (`TopPCurve`, from the
   `TileScores` of the installed settings: text rows and columns, a sink, the diagonal); a ladder
   density's top_p is **the grid top_p whose mean density over the captured calls is closest to
   it** (ties to the smaller), so on those calls the plan reaches the density on average (within
   one grid step's change), each call more or less as its attention is sharp or diffuse;
2. `top_p_router` (after the modes are chosen) measures each layer on its chosen mode with those
   top_p's (the selection the plan will run) against the same mode's dense output, and records the
   density each reached; the proposal reads these errors.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch

from sagevideo.attention.accuracy import PEAKY_SCORE_STD, error_stats, peaky_reason, score_std
from sagevideo.attention.functional import TORCH_SDPA, sageattn
from sagevideo.parallel.balance import balanced_head_order, rank_spread
from sagevideo.pipelines.plans import AttentionPlan, Choice, Granularity, Mode, Override, Sparse, dense_steps
from sagevideo.pipelines.routing import AttentionRouter
from sagevideo.pipelines.sparse import SparseRouting

# Fastest first (H200 measurements, docs/benchmarks-history.md): FP8 PV beats 16-bit PV; per-tile scales
# beat per-token ones. Full precision is what remains when no candidate is accurate enough.
CANDIDATES = (
    Choice(mode=Mode.int8_fp8, granularity=Granularity.block),
    Choice(mode=Mode.int8_fp16, granularity=Granularity.block),
    Choice(mode=Mode.int8_fp8, granularity=Granularity.token),
    Choice(mode=Mode.int8_fp16, granularity=Granularity.token),
)
FULL = Choice(mode=Mode.full)
# The worst cosine (over heads, calls and captured steps) a layer's sparse output must keep against
# the same mode's dense output. Looser than the quantization floors (0.998-0.999): sparsity is the
# larger saving, and `ab` judges the whole plan against full precision with a noise floor.
DEFAULT_SPARSE_BUDGET = 0.99


@dataclass
class WorstError:
    """Worst cosine / rel-L1 / RMSE seen for one (layer, candidate), and where."""

    cos: float = 1.0
    rel_l1: float = 0.0
    rmse: float = 0.0
    step: int | None = None
    calls: int = 0
    unsupported: str = ""

    def update(self, ref: torch.Tensor, out: torch.Tensor, step: int | None) -> None:
        e = error_stats(ref, out)
        self.calls += 1
        if e.cos_worst < self.cos:
            self.cos, self.step = e.cos_worst, step
        self.rel_l1 = max(self.rel_l1, e.rel_l1_worst)
        self.rmse = max(self.rmse, e.rmse_worst)


@dataclass
class SparseWorst(WorstError):
    """`WorstError` of one (layer, mode, density) of the sparse ladder against the mode's dense output,
    the mean density the selection reached (static selection takes the closest window; a calibrated
    top_p, the mean over the calls it measured) and the top_p it ran (None: the per-row density or a
    static window); for masks that differ per head, each head's mean density (`head_density`)."""

    density_sum: float = 0.0
    top_p: float | None = None
    head_density_sum: torch.Tensor | None = None  # fp64 (H,): each head's densities summed over the calls
    head_calls: int = 0

    @property
    def density(self) -> float:
        return self.density_sum / self.calls if self.calls else float("nan")

    def add_mask(self, mask: Any, heads: int) -> None:
        """Add a call's selected `mask` (`TileMask`, for `heads` query heads) to the density sums; its
        per-head densities too when it has one row per head (masks broadcast over heads do not)."""
        self.density_sum += mask.density
        if mask.keep.shape[1] != heads or (self.head_density_sum is not None and len(self.head_density_sum) != heads):
            return
        per_head = mask.density_per_head().mean(dim=0).cpu()
        self.head_density_sum = per_head if self.head_density_sum is None else self.head_density_sum + per_head
        self.head_calls += 1

    @property
    def head_density(self) -> tuple[float, ...] | None:
        """Each head's mean density over the calls whose masks were per head (4 decimals), None without any."""
        if self.head_density_sum is None:
            return None
        return tuple(round(float(d), 4) for d in self.head_density_sum / self.head_calls)


# The top_p grid a layer's top_p is chosen on: j / TOP_P_STEPS (a power of two, so each is exact in
# fp32, where selections compare); 2**-16 apart, finer than the densities' own steps at real shapes.
TOP_P_STEPS = 2**16


class TopPCurve:
    """The density each top_p j / TOP_P_STEPS (j = 0..TOP_P_STEPS) reaches, summed over the calls
    `add` saw (`TileScores.density_curve`, fp64 on the CPU: 0.5 MB whatever the call's size), and the
    mass the installed probe's columns carry (`TileScores.probe_column_mass`: large where a few keys
    draw every query, global keys)."""

    def __init__(self) -> None:
        self.sums = torch.zeros(TOP_P_STEPS + 1, dtype=torch.float64)
        self.calls = 0
        self.column_mass_sum, self.column_mass_max, self.column_mass_calls = 0.0, 0.0, 0

    def add(self, scores: Any) -> None:
        """One call's `TileScores` (the installed settings, the mode's tiles)."""
        self.sums += scores.density_curve(TOP_P_STEPS)
        self.calls += 1
        if scores.probe_column_mass is not None:
            self.column_mass_sum += float(scores.probe_column_mass.mean())
            self.column_mass_max = max(self.column_mass_max, float(scores.probe_column_mass.max()))
            self.column_mass_calls += 1

    @property
    def column_mass(self) -> tuple[float, float] | None:
        """(mean over calls and heads, worst head of any call) of the probe columns' mass; None without a probe."""
        if not self.column_mass_calls:
            return None
        return self.column_mass_sum / self.column_mass_calls, self.column_mass_max

    def top_p_for(self, density: float) -> tuple[float, float]:
        """(top_p, the mean density it reaches over the calls): the grid top_p in (0, 1] whose mean
        density is closest to `density`, ties to the smaller (the sparser)."""
        means = self.sums[1:] / max(self.calls, 1)  # top_p 0 is no plan's: (0, 1] only
        gap = (means - density).abs()
        j = int(torch.nonzero(gap == gap.min())[0])  # the first of the closest: the smallest top_p
        return (j + 1) / TOP_P_STEPS, float(means[j])


def sparse_ladder(sparse: Sparse) -> tuple[Sparse, ...]:
    """The densities calibration measures for `sparse`, sparsest first: its own, then 2x and 4x
    denser where below 1 (dense)."""
    densities = [sparse.density]
    for factor in (2, 4):
        denser = round(sparse.density * factor, 4)
        if denser < 1.0:
            densities.append(denser)
    return tuple(Sparse(method=sparse.method, density=d) for d in dict.fromkeys(densities))


@dataclass
class SparseProposal:
    """What calibration proposes for block-sparse attention: `chosen` (layer -> Sparse), `dense`
    (layer -> why it stays dense), the `budget` (worst cosine against dense) and the measured
    `errors` (layer -> mode label -> density -> SparseWorst)."""

    budget: float
    ladder: tuple[Sparse, ...]
    errors: dict[str, dict[str, dict[float, SparseWorst]]]
    chosen: dict[str, Sparse] = field(default_factory=dict)
    dense: dict[str, str] = field(default_factory=dict)
    modes: dict[str, str] = field(default_factory=dict)  # layer -> the mode label its error is read on
    column_mass: dict[str, tuple[float, float]] = field(default_factory=dict)  # `TopPCurve.column_mass`
    reuse_steps: int | None = None  # the reuse measured (`top_p_router`), None: none
    reused: dict[str, SparseWorst] = field(default_factory=dict)  # layer -> its chosen density on kept lists

    def worst(self) -> tuple[str, SparseWorst] | None:
        """The sparse layer with the lowest worst cosine at its chosen density, None when none is sparse."""
        picked = [(name, self.errors[name][self.modes[name]][s.density]) for name, s in self.chosen.items()]
        return min(picked, key=lambda item: item[1].cos) if picked else None

    def note(self) -> str:
        """One line: how many layers are sparse at which density, which stay dense, the worst layer."""
        counts = Counter(s.density for s in self.chosen.values())
        at = ", ".join(f"{n} at {d:g}" for d, n in sorted(counts.items())) or "none"
        line = (f"block-sparse ({self.ladder[0].method}, densities {', '.join(f'{s.density:g}' for s in self.ladder)}"
                f"; budget: worst cosine >= {self.budget:g} against the same mode dense): {len(self.chosen)} "
                f"layer(s) sparse ({at}), {len(self.dense)} dense")
        if self.reuse_steps:
            reusing = sum(s.reuse_steps is not None for s in self.chosen.values())
            line += f"; {reusing} of them reuse their lists for {self.reuse_steps} steps"
        worst = self.worst()
        if worst is not None:
            name, w = worst
            rule = "" if w.top_p is None else f"top_p {w.top_p:g}, "
            line += (f"; worst sparse layer {name}: cosine {w.cos:.5f}, rel-L1 {w.rel_l1:.4f} at density "
                     f"{self.chosen[name].density:g} ({rule}reached {w.density:.3f}, {self.modes[name]}, "
                     f"step {w.step})")
        return line

    def table(self) -> str:
        """One line per sparse layer: target density, its top_p (dynamic), the density reached on the
        captured calls, worst cosine and rel-L1 against the same mode dense, the mass the probe's
        columns carry (mean/worst head, dynamic), the least and largest head's density (dynamic), with a
        reuse measured the worst cosine on the lists kept from the step before (a '*' where the plan
        reuses them), the mode; then how unevenly those densities would load sequence-parallel ranks
        (`rank_balance`) ('' when no layer is sparse)."""
        if not self.chosen:
            return ""
        header = (f"{'layer':40s} {'density':>7s} {'top_p':>9s} {'reached':>7s} {'cosine':>8s} {'rel-L1':>7s} "
                  f"{'probe cols':>11s} {'heads':>9s} {'reused cos':>10s}   mode")
        lines = [header, "-" * len(header)]
        for name, sparse in self.chosen.items():
            w = self.errors[name][self.modes[name]][sparse.density]
            top_p = "-" if sparse.top_p is None else f"{sparse.top_p:.6f}"
            mass = self.column_mass.get(name)
            columns = "-" if mass is None else f"{mass[0]:.3f}/{mass[1]:.3f}"
            reused = self.reused.get(name)
            on_kept = "-" if reused is None else f"{reused.cos:.5f}" + ("*" if sparse.reuse_steps else " ")
            heads = "-" if sparse.head_density is None else \
                f"{min(sparse.head_density):.2f}-{max(sparse.head_density):.2f}"
            lines.append(f"{name:40s} {sparse.density:7g} {top_p:>9s} {w.density:7.3f} {w.cos:8.5f} {w.rel_l1:7.4f} "
                         f"{columns:>11s} {heads:>9s} {on_kept:>10s}   {self.modes[name]}")
        balance = [f"{world} ranks {own:.2f} -> {balanced:.2f}"
                   for world, (own, balanced) in self.rank_balance().items()]
        if balance:
            lines.append("ranks' load under Ulysses (the busiest rank's density sum over the mean, worst layer; "
                         "heads' own order -> the balanced order the plan gives): " + ", ".join(balance))
        return "\n".join(lines)

    def rank_balance(self, worlds: tuple[int, ...] = (2, 4, 8)) -> dict[int, tuple[float, float]]:
        """Per rank count that splits every measured layer's heads: the largest `balance.rank_spread`
        over the sparse layers with per-head densities, in the heads' own order and in the balanced
        order (`balanced_head_order`; its own where that is None). {} without per-head densities."""
        measured = [sparse.head_density for sparse in self.chosen.values() if sparse.head_density is not None]
        out = {}
        for world in worlds:
            if not measured or any(len(d) % world for d in measured):
                continue
            own = max(rank_spread(d, range(len(d)), world) for d in measured)
            balanced = max(rank_spread(d, balanced_head_order(d, world) or range(len(d)), world) for d in measured)
            out[world] = (own, balanced)
        return out

    def dense_note(self) -> str:
        """The layers kept dense and why, one per line ('' when none)."""
        return "\n".join(f"  {name}: {why}" for name, why in self.dense.items())


@dataclass
class CalibrationResult:
    """errors[layer][choice label] -> WorstError; plan: the chosen plan; threshold: cosine floor;
    score_std[layer]: the largest score standard deviation seen (`attention.accuracy.score_std`)."""

    errors: dict[str, dict[str, WorstError]]
    plan: AttentionPlan
    threshold: float
    chosen: dict[str, Choice] = field(default_factory=dict)
    score_std: dict[str, float] = field(default_factory=dict)
    sparse: SparseProposal | None = None  # with a `--sparse` setting: the per-layer proposal

    @property
    def peaky(self) -> dict[str, str]:
        """Layers kept in full precision because their attention is too peaky for INT8: name -> why."""
        return {name: peaky_reason(std) for name, std in self.score_std.items()
                if self.chosen.get(name) == FULL and peaky_reason(std)}

    def peaky_note(self) -> str:
        """One line naming the peaky layers ('' when there are none)."""
        if not self.peaky:
            return ""
        names = ", ".join(f"{name} (score std {self.score_std[name]:.0f})" for name in self.peaky)
        return (f"{len(self.peaky)} layer(s) kept in full precision, their attention too peaky for INT8 "
                f"(score std past {PEAKY_SCORE_STD:.0f}): {names}")

    def worst_layer(self, label: str | None = None) -> tuple[str, WorstError]:
        """Layer with the lowest worst cosine for a candidate (default: the fastest)."""
        label = label or CANDIDATES[0].label
        return min(((name, errs[label]) for name, errs in self.errors.items()), key=lambda item: item[1].cos)

    def table(self) -> str:
        labels = [c.label for c in CANDIDATES]
        header = f"{'layer':40s} " + " ".join(f"{lab:>16s}" for lab in labels) + f" {'score std':>9s}   chosen"
        lines = [f"worst cosine vs fp32 attention over heads, calls and captured steps (threshold {self.threshold})",
                 header, "-" * len(header)]
        for name, errs in self.errors.items():
            cells = []
            for lab in labels:
                w = errs[lab]
                cells.append(f"{'n/a':>16s}" if w.unsupported or not w.calls else f"{w.cos:16.5f}")
            std = self.score_std.get(name)
            flag = "  (peaky)" if name in self.peaky else ""
            lines.append(f"{name:40s} " + " ".join(cells) + (f" {std:9.1f}" if std is not None else f" {'':9s}")
                         + f"   {self.chosen[name].label}{flag}")
        return "\n".join(lines)


class ProbingRouter(AttentionRouter):
    """Returns full-precision attention; at captured steps also measures every candidate, and with a
    sparse `ladder`, at captured steps from `sparse_from` on, each candidate on the ladder's tiles."""

    def __init__(
        self, backend: str, capture_steps: set[int] | None, save_qkv: dict | None = None, on_measure=None,
        ladder: tuple[Sparse, ...] = (), sparse_from: int = 0,
    ):
        super().__init__(AttentionPlan.uniform(Mode.full), backend)
        self.capture_steps = capture_steps
        self.errors: dict[str, dict[str, WorstError]] = {}
        self.score_std: dict[str, float] = {}
        self.save_qkv = save_qkv
        self.on_measure = on_measure  # on_measure(layer, step) before each measured call: progress
        self.ladder, self.sparse_from = ladder, sparse_from
        self.sparse_errors: dict[str, dict[str, dict[float, SparseWorst]]] = {}
        self.not_sparse: dict[str, str] = {}  # layer -> why its calls cannot be sparse
        self.curves: dict[str, dict[str, TopPCurve]] = {}  # dynamic: layer -> P·V mode -> its top_p curve
        self.reuse_steps: int | None = None  # `top_p_router`'s: the reuse its second pass measures
        # layer -> mode label -> density -> the error on lists kept from the run's last selecting step
        self.reuse_errors: dict[str, dict[str, dict[float, SparseWorst]]] = {}
        if ladder:  # install gives it the layers' text positions and each forward's grid
            self.sparse = SparseRouting()

    def __call__(self, layer, q, k, v, *, attn_mask=None, is_causal=False, sm_scale=None, dropout_p=0.0,
                 enable_gqa=False):
        sdpa = dict(attn_mask=attn_mask, is_causal=is_causal, scale=sm_scale, enable_gqa=enable_gqa)
        out = TORCH_SDPA(q, k, v, dropout_p=dropout_p, **sdpa)
        step = self.clock.step
        if self.capture_steps is not None and step not in self.capture_steps:
            return out
        if self.on_measure is not None:
            self.on_measure(layer, step)
        ref = TORCH_SDPA(q.float(), k.float(), v.float(), **sdpa)
        self.score_std[layer] = max(self.score_std.get(layer, 0.0), score_std(q, k, sm_scale=sm_scale))
        errs = self.errors.setdefault(layer, {c.label: WorstError() for c in CANDIDATES})
        call = dict(attn_mask=attn_mask, is_causal=is_causal, sm_scale=sm_scale, enable_gqa=enable_gqa)
        dense = {}
        for choice in CANDIDATES:
            worst = errs[choice.label]
            try:
                dense[choice] = test = self._candidate(choice, q, k, v, call)
            except ValueError as err:  # e.g. a mask the kernels cannot honour: never choose this mode here
                worst.unsupported = str(err)
                continue
            worst.update(ref, test, step)
        if self.ladder and (step is None or step >= self.sparse_from):
            if self.ladder[0].method == "dynamic":  # measured by `top_p_router` once the top_p's are known
                self._add_curves(layer, q, k, call, {choice.mode.pv for choice in dense}, plain=not dropout_p)
            else:
                self._measure_sparse(layer, step, q, k, v, call, dense, plain=not dropout_p)
        if self.save_qkv is not None:
            key = f"{layer}.step{step}" if step is not None else layer
            if f"{key}.q" not in self.save_qkv:
                for role, t in zip("qkv", (q, k, v), strict=True):
                    self.save_qkv[f"{key}.{role}"] = t.detach().to("cpu", torch.float32).contiguous()
        return out

    def _candidate(self, choice: Choice, q, k, v, call: dict, tile_mask=None) -> torch.Tensor:
        """`choice`'s attention on the call (on `tile_mask`'s tiles when given)."""
        return _attend(self.backend, choice, q, k, v, call, tile_mask)

    def _add_curves(self, layer: str, q, k, call: dict, pvs: set[str], plain: bool) -> None:
        """Per P·V mode in `pvs` (its tiles), the density each top_p reaches on this call, into the layer's
        curve; a call that cannot be sparse notes why."""
        curves = self.curves.setdefault(layer, {})
        for pv in sorted(pvs):
            scores = self.sparse.scores(layer, q, k, pv=pv, attn_mask=call["attn_mask"], plain=plain,
                                        sm_scale=call["sm_scale"])
            if isinstance(scores, str):
                self.not_sparse[layer] = scores
                return
            curves.setdefault(pv, TopPCurve()).add(scores)

    def _measure_sparse(self, layer: str, step: int | None, q, k, v, call: dict, dense: dict, plain: bool) -> None:
        """Each ladder density's tiles (one selection per P·V mode: the tiles are the mode's), each
        candidate on them against its own dense output."""
        masks: dict[tuple[str, float], object] = {}
        errs = self.sparse_errors.setdefault(layer, {})
        for choice, dense_out in dense.items():
            for setting in self.ladder:
                key = (choice.mode.pv, setting.density)
                if key not in masks:
                    masks[key] = self.sparse.select(layer, setting, q, k, pv=choice.mode.pv,
                                                    attn_mask=call["attn_mask"], plain=plain)
                mask = masks[key]
                if isinstance(mask, str):
                    self.not_sparse[layer] = mask
                    return
                worst = errs.setdefault(choice.label, {}).setdefault(setting.density, SparseWorst())
                worst.update(dense_out, self._candidate(choice, q, k, v, call, tile_mask=mask), step)
                worst.density_sum += mask.density


def _attend(backend: str, choice: Choice, q, k, v, call: dict, tile_mask=None) -> torch.Tensor:
    """`choice`'s attention on a captured call (q, k, v (B, H, N, D); `call`: its SDPA arguments) on
    `backend`, on `tile_mask`'s tiles when given."""
    scratch = torch.zeros((), dtype=torch.int32, device=q.device)
    return sageattn(q, k, v, pv=choice.mode.pv, qk_granularity=choice.granularity.value, backend=backend,
                    tile_mask=tile_mask, **call,
                    _guard_counter=scratch)  # a measured mode, not a direct call: its error is measured here


class TopPRouter(AttentionRouter):
    """Calibration's second pass for dynamic selection: returns full-precision attention (the first
    pass's run again) and, at the probe's captured sparse steps, runs each layer of `settings` (layer
    -> (its chosen mode, its ladder with calibrated top_p's)) on the tiles each top_p selects (the
    installed settings, in PyTorch), against the same mode's dense output, into the probe's
    `sparse_errors` with the density reached. With `probe.reuse_steps` R, the steps between the
    selecting ones (every R-th from `sparse_from`, as an installed plan's run counts them) also run the
    lists the same forward of the step (guidance: one a forward) selected last, into
    `probe.reuse_errors`: what the plan with reuse would run there."""

    def __init__(self, probe: ProbingRouter, settings: dict[str, tuple[Choice, tuple[Sparse, ...]]]):
        super().__init__(AttentionPlan.uniform(Mode.full), probe.backend)
        self.probe, self.settings = probe, settings
        self.sparse = SparseRouting()  # install gives it the layers' text positions and each forward's grid
        self.kept: dict[tuple[str, int, float], Any] = {}  # (layer, forward of the step, density) -> its mask

    def __call__(self, layer, q, k, v, *, attn_mask=None, is_causal=False, sm_scale=None, dropout_p=0.0,
                 enable_gqa=False):
        sdpa = dict(attn_mask=attn_mask, is_causal=is_causal, scale=sm_scale, enable_gqa=enable_gqa)
        out = TORCH_SDPA(q, k, v, dropout_p=dropout_p, **sdpa)
        step, probe = self.clock.step, self.probe
        if layer not in self.settings or (probe.capture_steps is not None and step not in probe.capture_steps) or (
                step is not None and step < probe.sparse_from):
            return out
        if probe.on_measure is not None:
            probe.on_measure(layer, step)
        choice, ladder = self.settings[layer]
        call = dict(attn_mask=attn_mask, is_causal=is_causal, sm_scale=sm_scale, enable_gqa=enable_gqa)
        dense = _attend(self.backend, choice, q, k, v, call)
        errs = probe.sparse_errors.setdefault(layer, {}).setdefault(choice.label, {})
        reuse = probe.reuse_steps
        selecting = not reuse or step is None or (step - probe.sparse_from) % reuse == 0
        for setting in ladder:
            key = (layer, self.sparse.forwards - 1, setting.density)
            kept = None if selecting else self.kept.get(key)
            if kept is not None and _fits(kept, q, k):  # else the installed call selects afresh: nothing to add
                worst = probe.reuse_errors.setdefault(layer, {}).setdefault(choice.label, {}).setdefault(
                    setting.density, SparseWorst(top_p=setting.top_p))
                worst.update(dense, _attend(self.backend, choice, q, k, v, call, kept), step)
                worst.density_sum += kept.density
            mask = self.sparse.select(layer, setting, q, k, pv=choice.mode.pv, attn_mask=attn_mask,
                                      plain=not dropout_p, sm_scale=sm_scale)
            if isinstance(mask, str):
                probe.not_sparse[layer] = mask
                break
            if reuse and selecting:
                self.kept[key] = mask
            worst = errs.setdefault(setting.density, SparseWorst(top_p=setting.top_p))
            worst.update(dense, _attend(self.backend, choice, q, k, v, call, mask), step)
            worst.add_mask(mask, q.shape[1])
        return out


def _fits(mask: Any, q: torch.Tensor, k: torch.Tensor) -> bool:
    """Whether a tile mask fits the call (`TileMask.check_inputs`), as kept lists must to be reused."""
    try:
        mask.check_inputs(q, k)
    except ValueError:
        return False
    return True


def top_p_router(probe: ProbingRouter, *, threshold: float = 0.999, dense_layers: tuple[str, ...] = (),
                 reuse_steps: int | None = None) -> TopPRouter | None:
    """The second pass of a dynamic ladder (module docstring), None for any other probe: per layer that
    may be sparse (a quantized chosen mode, not in `dense_layers` (each denoiser's first sparse layer),
    a top_p curve on its mode's tiles), each ladder density's calibrated top_p (`TopPCurve.top_p_for`),
    to measure by running the same prompts under it; `calibration_result` (same threshold) then
    proposes from what it measured. reuse_steps (> 1): also measure the layers reusing their lists
    over that many steps (`TopPRouter`), which `choose_sparse` proposes where it meets the budget."""
    if not probe.ladder or probe.ladder[0].method != "dynamic" or not probe.errors:
        return None
    probe.reuse_steps = reuse_steps if reuse_steps and reuse_steps > 1 else None
    _, chosen = choose_plan(probe.errors, threshold, None, None)
    skip = set(dense_layers)
    settings = {}
    for layer, choice in chosen.items():
        curve = probe.curves.get(layer, {}).get(choice.mode.pv)
        if choice.mode is Mode.full or layer in skip or layer in probe.not_sparse or curve is None:
            continue
        settings[layer] = (choice, tuple(s.model_copy(update={"top_p": curve.top_p_for(s.density)[0]})
                                         for s in probe.ladder))
    return TopPRouter(probe, settings)


def choose_sparse(probe: ProbingRouter, chosen: dict[str, Choice], budget: float,
                  dense_layers: tuple[str, ...]) -> SparseProposal:
    """Per layer, on its chosen mode, the sparsest ladder density whose worst cosine against dense
    meets `budget`; dense (with the reason) where none does, where the layer runs full precision or
    cannot be sparse, and in `dense_layers` (each denoiser's first sparse layer). Where a reuse was
    measured (`probe.reuse_steps`), a sparse layer reuses its lists when its worst cosine on kept lists
    at that density meets the budget too."""
    proposal = SparseProposal(budget, probe.ladder, probe.sparse_errors, reuse_steps=probe.reuse_steps)
    for layer, choice in chosen.items():
        measured = probe.sparse_errors.get(layer, {}).get(choice.label, {})
        if choice.mode is Mode.full:
            proposal.dense[layer] = "full precision (never block-sparse)"
        elif layer in dense_layers:
            proposal.dense[layer] = "the denoiser's first sparse layer (kept dense by default)"
        elif layer in probe.not_sparse:
            proposal.dense[layer] = probe.not_sparse[layer]
        elif not measured and probe.curves.get(layer):
            proposal.dense[layer] = "its top_p's were not measured (the second pass, `top_p_router`, did not run)"
        elif not measured:
            proposal.dense[layer] = "no captured call at a step the plan would make sparse"
        else:
            proposal.modes[layer] = choice.label
            curve = probe.curves.get(layer, {}).get(choice.mode.pv)
            if curve is not None and curve.column_mass is not None:
                proposal.column_mass[layer] = curve.column_mass
            ok = [s for s in probe.ladder if s.density in measured and measured[s.density].cos >= budget]
            if ok and measured[ok[0].density].density >= 1.0:  # e.g. text and diagonal tiles cover a small call
                proposal.dense[layer] = f"nothing to skip: the selection kept every tile at density {ok[0].density:g}"
            elif ok:
                density = ok[0].density
                reused = probe.reuse_errors.get(layer, {}).get(choice.label, {}).get(density)
                reuse = probe.reuse_steps if reused is not None and reused.cos >= budget else None
                proposal.chosen[layer] = ok[0].model_copy(update={
                    "top_p": measured[density].top_p, "reuse_steps": reuse,
                    "head_density": measured[density].head_density})
                if reused is not None:
                    proposal.reused[layer] = reused
            else:
                densest = probe.ladder[-1].density
                proposal.dense[layer] = (f"over budget: worst cosine {measured[densest].cos:.5f} < {budget:g} even at "
                                         f"density {densest:g}")
    return proposal


def choose_plan(
    errors: dict[str, dict[str, WorstError]], threshold: float, model: str | None, num_steps: int | None
) -> tuple[AttentionPlan, dict[str, Choice]]:
    """Per layer the fastest candidate with worst cosine >= threshold (else full precision);
    the most common choice becomes the plan's default, the rest overrides."""
    chosen = {}
    for layer, errs in errors.items():
        ok = [c for c in CANDIDATES if not errs[c.label].unsupported and errs[c.label].calls
              and errs[c.label].cos >= threshold]
        chosen[layer] = ok[0] if ok else FULL
    default = Counter(chosen.values()).most_common(1)[0][0] if chosen else CANDIDATES[0]
    overrides = tuple(
        Override(layers=tuple(sorted(name for name, c in chosen.items() if c == choice)),
                 mode=choice.mode, granularity=choice.granularity)
        for choice in dict.fromkeys(chosen.values()) if choice != default
    )
    plan = AttentionPlan(model=model, layers=tuple(errors), num_steps=num_steps, default=default, overrides=overrides)
    return plan, chosen


def probing_router(
    pipe, *, backend: str | None = None, capture_steps: set[int] | None = None, save_qkv: dict | None = None,
    on_measure=None, sparse: Sparse | None = None, num_steps: int | None = None,
) -> ProbingRouter:
    """The probing router for calibrating `pipe`. backend defaults to "triton" on CUDA and
    "reference" (the exact emulation) on CPU, never "auto", which could silently measure SDPA.
    on_measure(layer, step) is called before each measured attention call (a progress display).
    sparse: also measure `sparse_ladder(sparse)` at the steps a run of `num_steps` would make sparse."""
    if backend is None:
        backend = "triton" if pipe.transformer.device.type == "cuda" else "reference"
    if sparse is None:
        return ProbingRouter(backend, capture_steps, save_qkv, on_measure)
    if num_steps is None:
        raise ValueError("probing_router: sparse needs num_steps (the first ceil(steps/5) steps stay dense)")
    return ProbingRouter(backend, capture_steps, save_qkv, on_measure, ladder=sparse_ladder(sparse),
                         sparse_from=dense_steps(num_steps))


def calibration_result(
    probe: ProbingRouter, pipe, *, threshold: float = 0.999, num_steps: int | None = None,
    sparse_budget: float = DEFAULT_SPARSE_BUDGET,
) -> CalibrationResult:
    """The per-layer errors a probing router measured, and the plan they choose (with the router's
    sparse ladder: each layer's proposed density from step ceil(num_steps/5) on, `choose_sparse`)."""
    from sagevideo.pipelines.sparse import first_sparse_layers

    if not probe.errors:
        raise RuntimeError("calibration captured no attention call: check --capture-steps against --steps")
    plan, chosen = choose_plan(probe.errors, threshold, type(pipe.transformer).__name__, num_steps)
    result = CalibrationResult(probe.errors, plan, threshold, chosen, probe.score_std)
    if probe.ladder:
        result.sparse = choose_sparse(probe, chosen, sparse_budget, first_sparse_layers(pipe))
        if result.sparse.chosen:
            result.plan = plan.with_sparse_layers(result.sparse.chosen, steps=num_steps)
    return result
