"""sagevideo/attention/accuracy.py: error metrics against exact attention, and how peaky scores are."""

import pytest
import torch

from sagevideo.attention.accuracy import PEAKY_SCORE_STD, attention_fp64, error_stats, peaky_reason, score_std


def test_error_stats_see_the_worst_slice_not_only_the_mean():
    ref = torch.randn(1, 4, 32, 16, generator=torch.Generator().manual_seed(0))
    out = ref.clone()
    out[0, 2] = -out[0, 2]  # one head wrong
    stats = error_stats(ref, out)
    assert stats.n_slices == 4 and stats.nonfinite == 0
    assert stats.cos_worst == pytest.approx(-1.0) and stats.cos_mean == pytest.approx(0.5)
    assert error_stats(ref, ref).cos_worst == pytest.approx(1.0) and error_stats(ref, ref).rel_l1_worst == 0.0


def test_attention_fp64_is_sdpa_in_double():
    q, k, v = (torch.randn(1, 2, 8, 16, generator=torch.Generator().manual_seed(i)) for i in range(3))
    expected = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double())
    assert torch.allclose(attention_fp64(q, k, v), expected)


def test_peaky_scores_are_named_past_the_measured_limit():
    q = torch.zeros(1, 1, 4, 8)
    assert score_std(q, torch.randn(1, 1, 16, 8)) == 0.0 and peaky_reason(0.0) == ""
    assert peaky_reason(PEAKY_SCORE_STD * 2).startswith("peaky attention: score std 20 is past INT8's resolution")
