"""What this machine can hold: available memory per device, and sizes and durations for messages.

Estimates elsewhere (a job's peak memory, a simulation's fp64 reference) are compared with
`available_bytes` before any work starts, so a run that cannot fit is refused with its estimate
instead of swapping or being killed hours later; `budget_problems` does it for a planned batch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from sagevideo.jobs.problems import where
from sagevideo.jobs.specs import JobSpec
from sagevideo.pipelines.loading import ModelSource


def available_bytes(device: str = "cpu") -> int | None:
    """Memory a new allocation can use now: free GPU memory on "cuda[:N]", else available RAM;
    None when the device cannot tell (then nothing is refused for memory)."""
    if device.startswith("cuda"):
        import torch

        try:
            free, _ = torch.cuda.mem_get_info(torch.device(device))
        except (RuntimeError, AssertionError):  # no usable CUDA runtime after all
            return None
        return int(free)
    import psutil

    return int(psutil.virtual_memory().available)


def format_bytes(n: float) -> str:
    """1536 -> '1.5 KB', 3.2e11 -> '320 GB' (decimal units, as memory is usually quoted)."""
    for unit in ("B", "KB", "MB", "GB", "TB", "PB"):
        if abs(n) < 1000 or unit == "PB":
            return f"{n:.0f} {unit}" if unit == "B" or abs(n) >= 100 else f"{n:.1f} {unit}"
        n /= 1000
    raise AssertionError("unreachable")


def format_seconds(s: float) -> str:
    """42 -> '42 s', 150 -> '2.5 min', 7300 -> '2.0 h', 260000 -> '3.0 days'."""
    if s < 90:
        return f"{s:.0f} s"
    if s < 5400:
        return f"{s / 60:.1f} min"
    if s < 172800:
        return f"{s / 3600:.1f} h"
    return f"{s / 86400:.1f} days"


def budget_problems(
    source: ModelSource,
    resolved: list[tuple[JobSpec, Any]],
    backends: Mapping[tuple[str, str | None], str | None],
    device: str,
    dtype: str,
    job_timeout: float | None,
    *,
    local: bool,
    recipe: Any = None,
) -> tuple[list[tuple[str, str]], list[str]]:
    """(problems, notes): jobs whose estimated peak memory exceeds what this machine's device has
    free are refused with the estimate (`local`: the jobs run here, not on a cluster's nodes);
    large CPU jobs get a note with their measured attention time."""
    from sagevideo.generation.estimate import TIME_ESTIMATE_FROM_TOKENS, attention_seconds, estimate_job, time_note

    free = available_bytes(device) if local else None
    problems, notes, timed = [], [], set()
    for j, label in resolved:
        backend = backends[(j.attention, j.pv)]
        estimate = estimate_job(source, j, backend, dtype, recipe)
        if free is not None and estimate.peak > free:
            problems.append((where(label), (
                f"needs {estimate.describe()}, but the {device} has {format_bytes(free)} free; "
                "use a smaller resolution or fewer frames"
            )))
            continue
        key = (j.height, j.width, j.frames, j.steps, j.guidance > 1, backend, j.pv)
        if device == "cpu" and estimate.tokens >= TIME_ESTIMATE_FROM_TOKENS and key not in timed:
            timed.add(key)
            seconds = attention_seconds(source, j, backend, device, dtype)
            estimate = dataclasses.replace(estimate, attention_s=seconds)
            notes.append(time_note(str(label), estimate, backend, device, job_timeout))
    return problems, notes
