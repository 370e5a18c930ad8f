"""`experiments/bench/timing.py`: the round-robin order, the medians, the clock and the cosines."""

import pytest
import torch

from sagevideo.experiments.bench.timing import (
    cosine_worst,
    interleaved,
    median,
    median_ms,
    median_seconds,
    output_cosine,
)


def test_arms_are_measured_round_robin_and_a_failing_arm_is_dropped():
    order = []
    clock = {"a": iter([3.0, 1.0, 2.0]), "b": iter([5.0, 4.0, 6.0])}

    def measure(fn):
        name = fn()
        order.append(name)
        return next(clock[name])

    def broken():
        raise RuntimeError("No available kernel\ndetails")

    runs, errors = interleaved({"a": lambda: "a", "b": lambda: "b", "c": broken}, 3, measure)
    assert order == ["a", "b"] * 3
    assert runs == {"a": [3.0, 1.0, 2.0], "b": [5.0, 4.0, 6.0]}
    assert errors == {"c": "No available kernel"}
    assert median(runs["a"]) == 2.0 and median([4.0, 1.0]) == 4.0  # always a measured value


def test_the_clocks_time_calls_on_the_cpu():
    calls = []
    assert median_ms(lambda: calls.append(1), "cpu", budget_ms=1.0) >= 0
    assert len(calls) >= 2 + 3  # warm-up, estimate, at least three timed calls
    calls.clear()
    assert median_seconds(lambda: calls.append(1), 2, "cpu") >= 0 and len(calls) == 3


def test_cosines():
    out = torch.randn(2 * 13 * 16 * 60 * 90, generator=torch.Generator().manual_seed(0))
    assert abs(output_cosine(out, out.clone()) - 1.0) < 1e-12  # fp64: fp32 accumulation gives 1.00007
    assert output_cosine(out, -out) == pytest.approx(-1.0, abs=1e-12)
    ref = torch.randn(1, 3, 8, 4, generator=torch.Generator().manual_seed(1))
    worse = ref.clone()
    worse[0, 2] = -worse[0, 2]  # one head flipped: the worst head decides
    assert cosine_worst(ref, worse) == pytest.approx(-1.0, abs=1e-6)
