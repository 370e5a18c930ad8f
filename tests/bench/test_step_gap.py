"""bench/step_gap.py: the device's idle gaps over profiled steps and the CPU ops in them."""

from types import SimpleNamespace

import pytest
import torch
from torch.autograd import DeviceType

from bench import step_gap


def test_idle_gaps_are_the_window_less_the_union_of_busy_intervals():
    busy = [(30, 50), (10, 20), (15, 25), (70, 200)]  # overlapping, unsorted, past the window's end
    assert step_gap.idle_gaps(busy, (0, 100)) == [(0, 10), (25, 30), (50, 70)]
    assert step_gap.idle_gaps([], (5, 9)) == [(5, 9)]
    assert step_gap.idle_gaps([(0, 100)], (0, 100)) == []


def _event(name, start, end, device=DeviceType.CPU, parent=None):
    return SimpleNamespace(name=name, device_type=device, time_range=SimpleNamespace(start=start, end=end),
                           cpu_parent=parent)


def test_a_gap_names_the_top_level_cpu_ops_that_ran_in_it():
    sync = _event("aten::_local_scalar_dense", 0, 2000)
    noise = _event("aten::normal_", 2000, 14000)
    inner = _event("aten::empty", 2100, 2200, parent=noise)  # inside normal_: not counted again
    forward = _event("aten::linear", 14000, 15000)
    kernels = [_event("gemm", 0, 2000, DeviceType.CUDA), _event("gemm", 15000, 40000, DeviceType.CUDA)]
    report = step_gap.gap_report([sync, noise, inner, forward, *kernels], steps=1)
    assert report["window_ms"] == 40 and report["idle_ms"] == 13 and report["busy_ms"] == 27
    (gap,) = report["gaps"]
    assert gap["ms"] == 13 and gap["at_ms"] == 2
    assert gap["cpu_ops"] == {"aten::normal_": 12, "aten::linear": 1}
    assert "13.0 ms at" in step_gap.gap_lines(report)[1] and "aten::normal_ 12.0" in step_gap.gap_lines(report)[1]


def test_the_profiler_covers_the_steps_asked_for_on_the_cpu():
    syncs = []
    profiler = step_gap.StepProfiler(1, 2, lambda: syncs.append(1), cuda=False)
    for step in range(4):
        torch.randn(64, 64) @ torch.randn(64, 64)
        profiler.on_step(step)
    assert len(syncs) == 2 and profiler.report["steps"] == 2
    assert profiler.report["idle_ms"] == pytest.approx(profiler.report["window_ms"])  # no device kernels on a CPU
    assert any("aten::" in name for gap in profiler.report["gaps"] for name in gap["cpu_ops"])


def test_step_zero_is_not_profiled():
    with pytest.raises(ValueError, match="step 0 compiles"):
        step_gap.StepProfiler(0, 2, lambda: None, cuda=False)
