"""What this machine can hold: available memory per device, and sizes and durations for messages.

Estimates elsewhere (a job's peak memory, a simulation's fp64 reference) are compared with
`available_bytes` before any work starts, so a run that cannot fit is refused with its estimate
instead of swapping or being killed hours later.
"""

from __future__ import annotations


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
