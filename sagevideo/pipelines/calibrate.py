"""Calibration: measure every attention layer's error per mode on real prompts, write a plan.

The SageAttention paper's adaptive selection (§4.5), as a tool. A probing router is installed
in place of the plan router: every attention call returns full-precision SDPA (so the run is the
full-precision run), and at the captured steps it also runs each candidate mode on the same
Q/K/V and compares it with an fp32 reference, keeping the worst over heads, calls and steps.
The plan then picks, per layer, the fastest candidate whose worst cosine meets the threshold,
and full precision where none does.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import torch

from sagevideo.attention.accuracy import PEAKY_SCORE_STD, error_stats, peaky_reason, score_std
from sagevideo.attention.functional import TORCH_SDPA, sageattn
from sagevideo.pipelines.plans import AttentionPlan, Choice, Granularity, Mode, Override
from sagevideo.pipelines.routing import AttentionRouter

# Fastest first (H200 measurements, docs/benchmarks-history.md): FP8 PV beats 16-bit PV; per-tile scales
# beat per-token ones. Full precision is what remains when no candidate is accurate enough.
CANDIDATES = (
    Choice(mode=Mode.int8_fp8, granularity=Granularity.block),
    Choice(mode=Mode.int8_fp16, granularity=Granularity.block),
    Choice(mode=Mode.int8_fp8, granularity=Granularity.token),
    Choice(mode=Mode.int8_fp16, granularity=Granularity.token),
)
FULL = Choice(mode=Mode.full)


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
class CalibrationResult:
    """errors[layer][choice label] -> WorstError; plan: the chosen plan; threshold: cosine floor;
    score_std[layer]: the largest score standard deviation seen (`attention.accuracy.score_std`)."""

    errors: dict[str, dict[str, WorstError]]
    plan: AttentionPlan
    threshold: float
    chosen: dict[str, Choice] = field(default_factory=dict)
    score_std: dict[str, float] = field(default_factory=dict)

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
    """Returns full-precision attention; at captured steps also measures every candidate."""

    def __init__(
        self, backend: str, capture_steps: set[int] | None, save_qkv: dict | None = None, on_measure=None
    ):
        super().__init__(AttentionPlan.uniform(Mode.full), backend)
        self.capture_steps = capture_steps
        self.errors: dict[str, dict[str, WorstError]] = {}
        self.score_std: dict[str, float] = {}
        self.save_qkv = save_qkv
        self.on_measure = on_measure  # on_measure(layer, step) before each measured call: progress

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
        scratch = torch.zeros((), dtype=torch.int32, device=q.device)
        for choice in CANDIDATES:
            worst = errs[choice.label]
            try:
                test = sageattn(
                    q, k, v, attn_mask=attn_mask, is_causal=is_causal, sm_scale=sm_scale, pv=choice.mode.pv,
                    qk_granularity=choice.granularity.value, backend=self.backend, enable_gqa=enable_gqa,
                    _guard_counter=scratch,  # a measured mode, not a direct call: its error is measured here
                )
            except ValueError as err:  # e.g. a mask the kernels cannot honour: never choose this mode here
                worst.unsupported = str(err)
                continue
            worst.update(ref, test, step)
        if self.save_qkv is not None:
            key = f"{layer}.step{step}" if step is not None else layer
            if f"{key}.q" not in self.save_qkv:
                for role, t in zip("qkv", (q, k, v), strict=True):
                    self.save_qkv[f"{key}.{role}"] = t.detach().to("cpu", torch.float32).contiguous()
        return out


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
    on_measure=None,
) -> ProbingRouter:
    """The probing router for calibrating `pipe`. backend defaults to "triton" on CUDA and
    "reference" (the exact emulation) on CPU, never "auto", which could silently measure SDPA.
    on_measure(layer, step) is called before each measured attention call (a progress display)."""
    if backend is None:
        backend = "triton" if pipe.transformer.device.type == "cuda" else "reference"
    return ProbingRouter(backend, capture_steps, save_qkv, on_measure)


def calibration_result(
    probe: ProbingRouter, pipe, *, threshold: float = 0.999, num_steps: int | None = None
) -> CalibrationResult:
    """The per-layer errors a probing router measured, and the plan they choose."""
    if not probe.errors:
        raise RuntimeError("calibration captured no attention call: check --capture-steps against --steps")
    plan, chosen = choose_plan(probe.errors, threshold, type(pipe.transformer).__name__, num_steps)
    return CalibrationResult(probe.errors, plan, threshold, chosen, probe.score_std)
