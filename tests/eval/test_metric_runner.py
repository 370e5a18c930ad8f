"""eval/metric_runner.py: the difference video's frames (the whole pass: tests/eval/test_evaluate.py)."""

import numpy as np

from sagevideo.eval.metric_runner import _difference


def test_the_difference_is_amplified_and_saturates():
    ref = np.full((2, 4, 4, 3), 100, dtype=np.uint8)
    test = ref.copy()
    test[0] = 110
    test[1] = 0
    diff = _difference({"ref": ref, "test": test}, gain=8.0)
    assert diff.dtype == np.uint8 and diff.shape == ref.shape
    assert (diff[0] == 80).all() and (diff[1] == 255).all()
