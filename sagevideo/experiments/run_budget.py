"""Before `profile`, `bench forward` and `bench attention` allocate anything: the run's peak memory
and its time on this device, estimated, and a run refused (InputError, exit 2) that cannot fit in
what the device has available or would take longer than `max_hours` here.

Memory (the model of `generation.estimate`): a model run holds the transformer's weights (its
parameters counted on the meta device, in the run's dtype), one forward's activations (~16 values
per token and channel) and, for sagevideo attention on the CPU, the reference emulation's score
tiles. An attention run holds q, k, v, the fp32 reference output and, one arm at a time, that arm's
output and working memory (SDPA's math backend: the B·H·Nq·Nk fp32 scores and their softmax).

Time, on the CPU only (a GPU runs these sizes in seconds to minutes): every attention call from
one head at 1,024 tokens measured here, scaled by B·H·Nq·Nk
(`generation.estimate.attention_call_seconds`); a model's linears at 2 FLOPs per weight and
token at a 1024² matmul's measured rate. Memory is checked first, from arithmetic alone, so a run
that cannot fit is refused in the seconds the meta build takes; time is measured only for runs
large enough to matter. Both figures are floors: building the model, its norms and element-wise
ops are not counted.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sagevideo.errors import InputError

LONG_S = 20.0  # a run estimated longer than this here shows a progress bar
MAX_HOURS = 1.0  # --max-hours' default: past this a CPU run is refused
_TIMED_FROM = 64 * 1024 * 1024  # B·H·Nq·Nk of the largest call from which the time is estimated
_SCORES_COPIES = 2  # SDPA's math backend holds the scores and their softmax at once
_QUICK_S = 600.0  # a suggested smaller shape should run within this


@dataclass(frozen=True)
class RunEstimate:
    """A run's estimate. peak: bytes (parts: what makes it up); seconds: its time here (None: not
    estimated, on a GPU or for a small run); basis: how the seconds were found."""

    peak: int
    parts: dict[str, int] = field(default_factory=dict)
    seconds: float | None = None
    basis: str = ""

    @property
    def long(self) -> bool:
        """Long enough here to show a progress bar."""
        return self.seconds is not None and self.seconds > LONG_S


# --- model runs (`profile`, `bench forward`) -------------------------------------------------------


def check_model_run(name: str, size: dict, device: str, dtype: str, *, steps: dict[str, int], pv: str = "fp16",
                    max_hours: float = MAX_HOURS, option: str = "--model") -> RunEstimate:
    """Estimate running config `name` (`pipelines.forwards.CONFIGS`) at `size` (frames, height,
    width; None: the config's) for `steps` denoising steps ({"stock": n, "sage": m}: with stock or
    sagevideo attention) on `device` in `dtype`; InputError naming the fixes when it cannot fit in
    the available memory or would take longer than `max_hours` here (0: no limit). Nothing is
    allocated: the model is built on the meta device."""
    from sagevideo.generation.budget import available_bytes, format_bytes
    from sagevideo.generation.estimate import (
        ACTIVATIONS_PER_CHANNEL,
        DTYPE_BYTES,
        OVERHEAD_BYTES,
        reference_transient_bytes,
    )
    from sagevideo.pipelines.forwards import CONFIGS, step_size

    step = step_size(name, **size)
    width = DTYPE_BYTES[dtype]
    sage_here = steps.get("sage", 0) > 0 and device == "cpu"  # the reference emulation's tiles
    widest = max(c.batch * c.n_q * c.heads * c.head_dim for c in step.calls)  # one forward's tokens x channels
    parts = {"weights": step.parameters * width, "activations": ACTIVATIONS_PER_CHANNEL * width * widest}
    if sage_here:
        parts["sagevideo attention"] = max(reference_transient_bytes(c.batch, c.heads, c.n_q, c.head_dim, pv)
                                           for c in step.calls)
    peak = sum(parts.values()) + OVERHEAD_BYTES
    tokens = max(c.n_q for c in step.calls)
    what = (f"{option} {name} ({tokens:,} tokens per attention call, {step.parameters / 1e9:.2g} B parameters, "
            f"{dtype})")
    family = CONFIGS[name][0]
    fixes = (f"run it on a GPU (--device cuda), at a smaller --frames/--resolution, or on the tiny model "
             f"(--model tiny-{family})")
    free = available_bytes(device)
    if free is not None and peak > free:
        shown = ", ".join(f"{part} {format_bytes(n)}" for part, n in parts.items())
        raise InputError(f"{what}: needs about {format_bytes(peak)} ({shown}), but the {device} has "
                         f"{format_bytes(free)} available; {fixes}")
    largest = max(c.batch * c.heads * c.n_q * c.n_k for c in step.calls)
    if device != "cpu" or largest < _TIMED_FROM:
        return RunEstimate(peak, parts)
    seconds = _model_seconds(step, device, dtype, steps, pv)
    count = sum(steps.values())
    basis = (f"{count} step{'s' if count > 1 else ''} of {sum(c.calls for c in step.calls)} attention calls, "
             "each measured here at 1,024 tokens and scaled by N², and the linears at this machine's matmul rate")
    _refuse_if_long(what, seconds, basis, max_hours, fixes)
    return RunEstimate(peak, parts, seconds, basis)


def _model_seconds(step, device: str, dtype: str, steps: dict[str, int], pv: str) -> float:
    """Seconds of `steps` denoising steps ({"stock": n, "sage": m}) of a `StepSize` here."""
    from sagevideo.generation.estimate import attention_call_seconds, matmul_flops

    linears = 2 * step.parameters * step.samples * max(c.n_q for c in step.calls) / matmul_flops(device, dtype)
    total = 0.0
    for kind, count in steps.items():
        if count:
            backend = "reference" if kind == "sage" else None
            attention = sum(c.calls * attention_call_seconds(backend, device, dtype, c.batch, c.heads, c.n_q, c.n_k,
                                                             c.head_dim, pv) for c in step.calls)
            total += count * (attention + linears)
    return total


# --- attention runs (`bench attention`) ------------------------------------------------------------


@dataclass(frozen=True)
class Arm:
    """One timed arm: name; backend: sageattn's, or None for SDPA pinned to `sdpa`; pv: sageattn's."""

    name: str
    backend: str | None = None
    sdpa: str | None = None
    pv: str = "fp16"


def check_attention_run(shapes: list, arms: list[Arm], device: str, dtype: str, *, reps: int,
                        max_hours: float = MAX_HOURS, names: list[str] | None = None) -> RunEstimate:
    """Estimate timing `arms` at `shapes` (`bench.attention.AttentionShape`s) with `reps` rounds;
    InputError naming a shape that fits when one cannot fit in the available memory or the run
    would take longer than `max_hours` here (0: no limit). names: how the messages name each
    shape (default `--shape LABEL`). Nothing is allocated."""
    from sagevideo.generation.budget import available_bytes, format_bytes

    names = names or [f"--shape {shape.label}" for shape in shapes]
    free = available_bytes(device)
    fixes = "run it on a GPU (--device cuda), or give a smaller shape"
    peak, parts = 0, {}
    for shape, name in zip(shapes, names, strict=True):
        shape_peak, shape_parts = _attention_memory(shape, arms, device, dtype)
        if free is not None and shape_peak > free:
            shown = ", ".join(f"{part} {format_bytes(n)}" for part, n in shape_parts.items())
            smaller = _smaller(shape, arms, device, dtype, reps, free)
            raise InputError(f"{name} ({dtype}): needs about {format_bytes(shape_peak)} ({shown}), but the {device} "
                             f"has {format_bytes(free)} available; {fixes}{smaller}")
        if shape_peak > peak:
            peak, parts = shape_peak, shape_parts
    timed = [(s, n) for s, n in zip(shapes, names, strict=True) if s.batch * s.heads * s.n_q * s.n_k >= _TIMED_FROM]
    if device != "cpu" or not timed:
        return RunEstimate(peak, parts)
    per_shape = [_attention_seconds(s, arms, device, dtype, reps) for s, _ in timed]
    seconds = sum(per_shape)
    basis = (f"{' and '.join(arm.name for arm in arms)}, {attention_calls_per_arm(reps)} calls each, every call "
             "measured here at 1,024 tokens and scaled by N²")
    if max_hours and seconds > max_hours * 3600:
        slowest, name = timed[per_shape.index(max(per_shape))]
        _refuse_if_long(f"{name} ({dtype})", seconds, basis, max_hours,
                        fixes + _smaller(slowest, arms, device, dtype, reps, free))
    return RunEstimate(peak, parts, seconds, basis)


def attention_calls_per_arm(reps: int) -> int:
    """Calls `bench.attention.bench_shape` makes of an arm at a slow shape: one for its accuracy,
    then per round `median_ms`' warm-up, its estimate call and at least 3 timed calls."""
    return 1 + reps * 5


def _attention_memory(shape, arms: list[Arm], device: str, dtype: str) -> tuple[int, dict[str, int]]:
    from sagevideo.experiments.bench.attention import MATH_SCORES_LIMIT
    from sagevideo.generation.estimate import DTYPE_BYTES, OVERHEAD_BYTES, reference_transient_bytes

    width = DTYPE_BYTES[dtype]
    b, h, nq, nk, d = shape.batch, shape.heads, shape.n_q, shape.n_k, shape.head_dim
    scores = 4 * b * h * nq * nk  # fp32 bytes
    parts = {"q, k, v": b * h * (nq + 2 * nk) * d * width, "fp32 reference": b * h * nq * d * 4}
    working = {"fp32 reference's scores, one head": _SCORES_COPIES * scores // h if device == "cpu" else 0}
    for arm in arms:
        if arm.sdpa == "math" and not (device == "cuda" and scores > MATH_SCORES_LIMIT):  # not run there
            working[f"{arm.name}: scores"] = _SCORES_COPIES * scores
        elif arm.backend == "reference":
            working[f"{arm.name}: score tiles"] = reference_transient_bytes(b, h, nq, d, arm.pv)
        else:
            working[f"{arm.name}: output"] = b * h * nq * d * width * 3  # output and quantized copies
    largest = max(working, key=working.get)
    parts[largest] = working[largest]
    return sum(parts.values()) + OVERHEAD_BYTES, parts


def _attention_seconds(shape, arms: list[Arm], device: str, dtype: str, reps: int) -> float:
    from sagevideo.generation.estimate import attention_call_seconds

    args = (shape.batch, shape.heads, shape.n_q, shape.n_k, shape.head_dim)
    total = attention_call_seconds(None, device, "float32", *args, "fp16", "math")  # the fp32 reference
    for arm in arms:
        total += attention_calls_per_arm(reps) * attention_call_seconds(arm.backend, device, dtype, *args, arm.pv,
                                                                        arm.sdpa)
    return total


def _smaller(shape, arms: list[Arm], device: str, dtype: str, reps: int, free: int | None) -> str:
    """' (e.g. --shape BxHxNxD)': the shape with its tokens halved until it fits in `free` and runs
    within about ten minutes here, or '' when none does above 128 tokens."""
    import dataclasses

    smaller = shape
    while min(smaller.n_q, smaller.n_k) > 128:
        n_q, n_k = (max(128, n // 2 // 128 * 128) for n in (smaller.n_q, smaller.n_k))
        smaller = dataclasses.replace(smaller, n_q=n_q, n_k=n_k)
        fits = free is None or _attention_memory(smaller, arms, device, dtype)[0] <= free
        quick = device != "cpu" or _attention_seconds(smaller, arms, device, dtype, reps) <= _QUICK_S
        if fits and quick:
            return f" (e.g. --shape {smaller.label})"
    return ""


def _refuse_if_long(what: str, seconds: float, basis: str, max_hours: float, fixes: str) -> None:
    from sagevideo.generation.budget import format_seconds

    if max_hours and seconds > max_hours * 3600:
        raise InputError(f"{what}: would take about {format_seconds(seconds)} on this CPU ({basis}), more than "
                         f"--max-hours {max_hours:g}; {fixes}, or raise --max-hours")
