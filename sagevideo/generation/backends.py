"""Which `sageattn` backend each job's attention runs, decided on the driver without a kernel.

`resolve_backends(settings, jobs, source, device, dtype)` asks the attention room's registry
(`sagevideo.attention.backends`), from the device, dtype and the model's head dim alone, which
backend each (attention, pv) of the batch gets: None for attention "full" (the stock
processors), "reference" for --backend auto on CPU (the exact emulation), the Triton kernels
where they can run, else SDPA's fallback; an explicit backend that cannot run is refused.
"""

from __future__ import annotations

from typing import Any

from sagevideo.errors import InputError
from sagevideo.jobs.config import GenerateConfig
from sagevideo.jobs.specs import JobSpec
from sagevideo.pipelines.loading import ModelSource

BackendKey = tuple[str, str | None]  # a job's (attention, pv)

__all__ = ["BackendKey", "resolve_backends"]


def resolve_backends(
    settings: GenerateConfig, jobs: list[tuple[JobSpec, Any]], source: ModelSource, device: str, dtype: str
) -> tuple[dict[BackendKey, str | None], str | None, list[str]]:
    """({(attention, pv): backend} for every job, the batch's default backend (its own attention
    and pv; None for "full"), notes, each once). Raises InputError for an explicit backend that
    cannot run here."""
    backends: dict[BackendKey, str | None] = {}
    notes: list[str] = []
    for j, _ in jobs:
        key = (j.attention, j.pv)
        if key not in backends:
            backends[key], found = _resolve_backend(settings, j.attention, j.pv, source, device, dtype)
            notes += [n for n in found if n not in notes]
    default = backends.get((settings.attention, settings.pv if settings.attention == "sage" else None))
    if default is None and settings.attention == "sage":
        default, _ = _resolve_backend(settings, "sage", settings.pv, source, device, dtype)
    return backends, default, notes


def _resolve_backend(
    settings: GenerateConfig, attention: str, pv: str | None, source: ModelSource, device: str, dtype: str
) -> tuple[str | None, list[str]]:
    """(sageattn backend for the processors or None, notes) for jobs with this attention and pv.
    Explicit choices that cannot run raise."""
    import torch

    from sagevideo.attention import backends as attention_backends
    from sagevideo.attention.backends import AttentionCall, Backend

    if attention == "full":
        stock = source.model_family.title
        return None, [f"attention: full precision (the stock {stock} processor; nothing installed)"]
    backend = settings.backend
    if backend == "auto" and device == "cpu":
        # On CPU, sageattn's auto would fall back to full-precision SDPA and the run would not
        # exercise quantized numerics at all; the reference emulates them exactly.
        return "reference", [
            f"attention: --backend auto on CPU runs the quantization emulation (reference/{pv}); "
            "the Triton kernels need a CUDA GPU"
        ]
    if backend in ("auto", "triton"):
        # The attention room's registry decides, from the device, dtype and head dim alone: the
        # driver neither launches nor compiles a kernel (the workers choose each call's plan).
        call = AttentionCall(torch.device(device), getattr(torch, dtype), source.head_dim, pv=pv)
        try:
            problem = attention_backends.problem(Backend.TRITON, call)
        except ValueError as err:  # a misspelt SAGEVIDEO_SM90_KERNEL
            raise InputError(str(err)) from None
        if problem and backend == "triton":
            raise InputError(f"--backend triton cannot run: {problem}; use --backend auto or reference")
        if problem:
            return "auto", [f"attention: the Triton kernels cannot run ({problem}); auto falls back to SDPA"]
        return backend, [f"attention: Triton kernels (head dim {source.head_dim}, {pv.upper()} P·V on {device}; "
                         "`sagevideo env` shows each plan)"]
    return backend, [f"attention: sageattn backend {backend}/{pv}"]
