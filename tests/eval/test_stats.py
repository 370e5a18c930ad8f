"""Bootstrap confidence intervals over prompts (seeds averaged first; infinite values counted apart)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tests.helpers.evalkit import FAST

pytestmark = pytest.mark.usefixtures("one_thread")


def test_bootstrap_ci_over_prompts_averages_seeds_first():
    from sagevideo.eval.stats import summarize

    values = [1.0, 3.0, 10.0, 10.0]
    prompts = ["a", "a", "b", "b"]
    s = summarize(values, prompts, FAST)
    assert s["mean"] == pytest.approx(6.0) and s["n"] == 4 and s["n_prompts"] == 2
    assert s["ci95"][0] >= 2.0 - 1e-9 and s["ci95"][1] <= 10.0 + 1e-9
    assert summarize([math.inf, math.inf], ["a", "b"], FAST)["mean"] == math.inf
    mixed = summarize([math.inf, 30.0, 40.0], ["a", "b", "c"], FAST)
    assert mixed["mean"] == pytest.approx(35.0) and mixed["n_infinite"] == 1
    assert np.isfinite(mixed["ci95"]).all()
