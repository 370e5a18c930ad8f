"""Where a denoising step's time goes beyond its device work (issue 21: both pipelines' steps take
~57 ms longer than their transformer forward alone).

`StepProfiler` wraps some steps of a pipeline call in torch.profiler from its step callback;
`gap_report` then finds the device's idle gaps between kernels over those steps and, for the
longest, the top-level CPU ops that ran meanwhile (a sync shows as `aten::_local_scalar_dense` or
`aten::item`, noise drawn on the CPU as `aten::normal_`/`aten::randn`, a copy as `aten::to`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

Interval = tuple[float, float]  # (start, end), microseconds on the profiler's clock


def idle_gaps(busy: Sequence[Interval], window: Interval) -> list[Interval]:
    """The parts of `window` that no interval of `busy` covers (busy may overlap, in any order)."""
    gaps, cursor = [], window[0]
    for start, end in sorted(busy):
        if start > cursor:
            gaps.append((cursor, min(start, window[1])))
        cursor = max(cursor, end)
        if cursor >= window[1]:
            break
    if cursor < window[1]:
        gaps.append((cursor, window[1]))
    return [(a, b) for a, b in gaps if b > a]


def gap_report(events, steps: int, top: int = 5, ops_per_gap: int = 4) -> dict:
    """From profiler `events` (FunctionEvents) spanning `steps` steps: the window, the device's
    busy and idle milliseconds (per step too), and the `top` longest idle gaps, each with the
    top-level CPU ops overlapping it (name -> ms of overlap). Without device kernels (a CPU run)
    the whole window is idle."""
    from torch.autograd import DeviceType

    cpu = [e for e in events if e.device_type == DeviceType.CPU]
    kernels = [(e.time_range.start, e.time_range.end) for e in events if e.device_type == DeviceType.CUDA]
    if not cpu and not kernels:
        raise ValueError("gap_report: the profiler recorded no events")
    spans = [(e.time_range.start, e.time_range.end) for e in cpu] + kernels
    window = (min(s for s, _ in spans), max(e for _, e in spans))
    gaps = idle_gaps(kernels, window)
    idle = sum(b - a for a, b in gaps)
    outer = [e for e in cpu if e.cpu_parent is None]
    largest = []
    for start, end in sorted(gaps, key=lambda g: g[0] - g[1])[:top]:
        overlap: dict[str, float] = {}
        for e in outer:
            shared = min(end, e.time_range.end) - max(start, e.time_range.start)
            if shared > 0:
                overlap[e.name] = overlap.get(e.name, 0.0) + shared / 1e3
        ops = dict(sorted(overlap.items(), key=lambda kv: -kv[1])[:ops_per_gap])
        largest.append({"ms": (end - start) / 1e3, "at_ms": (start - window[0]) / 1e3, "cpu_ops": ops})
    window_ms = (window[1] - window[0]) / 1e3
    return {"steps": steps, "window_ms": window_ms, "busy_ms": window_ms - idle / 1e3, "idle_ms": idle / 1e3,
            "idle_per_step_ms": idle / 1e3 / steps, "gaps": largest}


def gap_lines(report: dict) -> list[str]:
    """The report as text: the totals, then each gap and its CPU ops."""
    lines = [f"profiled {report['steps']} steps: {report['window_ms']:.1f} ms, device busy {report['busy_ms']:.1f} ms, "
             f"idle {report['idle_ms']:.1f} ms ({report['idle_per_step_ms']:.1f} ms a step); longest idle gaps:"]
    for gap in report["gaps"]:
        ops = ", ".join(f"{name} {ms:.1f}" for name, ms in gap["cpu_ops"].items()) or "no CPU op"
        lines.append(f"  {gap['ms']:8.1f} ms at {gap['at_ms']:9.1f} ms: {ops}")
    return lines


class StepProfiler:
    """Profiles denoising steps [first, first + count) of one pipeline call, from its step
    callback: `on_step(step)` at the end of each step (0-based), with `sync` waiting for the
    device. `report` holds `gap_report`'s dict once the last of them ended."""

    def __init__(self, first: int, count: int, sync: Callable[[], None], cuda: bool):
        if first < 1 or count < 1:
            raise ValueError(f"StepProfiler: first={first} must be >= 1 (step 0 compiles and warms up), count >= 1")
        self.first, self.count, self.sync, self.cuda = first, count, sync, cuda
        self.report: dict | None = None
        self._profile = None

    def on_step(self, step: int) -> None:
        from torch.profiler import ProfilerActivity, profile

        if step == self.first - 1:
            self.sync()  # the window starts with the device's queue empty
            activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.cuda else [])
            self._profile = profile(activities=activities)
            self._profile.__enter__()
        elif step == self.first + self.count - 1 and self._profile is not None:
            self.sync()
            self._profile.__exit__(None, None, None)
            self.report = gap_report(self._profile.events(), self.count)
            self._profile = None
