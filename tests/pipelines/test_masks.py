"""`pipelines/masks.py`: materialized key-padding masks read back as the kernels' key masks, exactly
checked; every other mask left as it came (SDPA, recorded with its reason)."""

import math

import pytest
import torch
import torch.nn.functional as F

import sagevideo
from sagevideo.pipelines.masks import KeyPadding, KeyPaddingRouter, factor
from sagevideo.pipelines.plans import AttentionPlan
from sagevideo.pipelines.routing import AttentionRouter

B, H, N, D = 2, 2, 12, 64
KEYS = torch.tensor([[True] * 9 + [False] * 3, [True] * 5 + [False] * 7])  # (B, N): per-sample padding


def _qkv(seed=0):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(B, H, N, D, generator=gen) for _ in range(3))


def _outer(queries, keys, heads=1):
    """(B, heads, N, N) bool: what HunyuanVideo 1.5's processors build (query mask & key mask)."""
    return (queries[:, None, :, None] & keys[:, None, None, :]).expand(B, heads, N, N).contiguous()


def _additive(mask, fill):
    return torch.zeros(mask.shape).masked_fill(~mask, fill)


# mask -> (form, whether it is query x key padding, whether some query attends no key)
def _accepted():
    rows_equal = KEYS[:, None, None, :].expand(B, H, N, N).contiguous()  # a per-query copy, materialized
    return {
        "rows equal (B, H, N, N)": (rows_equal, KeyPadding(), False),
        "query x key (B, 1, N, N)": (_outer(KEYS, KEYS), KeyPadding(), True),
        "query x key per head (B, H, N, N)": (_outer(KEYS, KEYS, H), KeyPadding(), True),
        "float 0/-inf, query x key": (_additive(_outer(KEYS, KEYS), -math.inf), KeyPadding(), True),
        "float 0/finfo.min per head (B, H, 1, N)": (
            _additive(KEYS[:, None, None, :].expand(B, H, 1, N).contiguous(), torch.finfo(torch.float32).min),
            KeyPadding(), False),
        "float 0/-10000 per head, declared": (
            _additive(KEYS[:, None, None, :].expand(B, H, 1, N).contiguous(), -10000.0), KeyPadding(-10000.0), False),
    }


def _rejected():
    causal = torch.ones(N, N, dtype=torch.bool).tril()[None, None].expand(B, 1, N, N).contiguous()
    heads_differ = _outer(KEYS, KEYS, H)
    heads_differ[:, 1, :, 0] = False
    ltx = KEYS[:, None, None, :].expand(B, H, 1, N).contiguous()
    every_key_masked = ltx.clone()
    every_key_masked[1] = False
    return {
        "causal": (causal, KeyPadding(), "is not a key-padding mask"),
        "one key set per head": (heads_differ, KeyPadding(), "is not a key-padding mask"),
        "float 0/-10000 undeclared": (_additive(ltx, -10000.0), KeyPadding(), "dtype torch.float32"),
        "float weights": (_additive(ltx, -10000.0) * 0.5, KeyPadding(-10000.0), "dtype torch.float32"),
        "every key of a sample at -10000": (_additive(every_key_masked, -10000.0), KeyPadding(-10000.0),
                                            "dtype torch.float32"),
    }


@pytest.mark.parametrize("name", sorted(_accepted()))
def test_materialized_key_padding_is_factored(name):
    mask, form, some_query_masked = _accepted()[name]
    got = factor(mask, form)
    assert got is not None and got.key.shape == (B, 1, 1, N) and torch.equal(got.key[:, 0, 0], KEYS)
    assert (got.query is not None) == some_query_masked
    if some_query_masked:
        assert torch.equal(got.query[:, 0, :, 0], KEYS)


@pytest.mark.parametrize("name", sorted(_rejected()))
def test_other_masks_are_not_factored(name):
    mask, form, _ = _rejected()[name]
    assert factor(mask, form) is None


@pytest.mark.parametrize("name", sorted(_accepted()))
def test_read_as_key_padding_the_result_is_sdpas_on_the_mask_given(name):
    """Full precision through the router equals SDPA on the mask as the model gave it (rows of masked
    queries 0, as SDPA makes them); quantized, every call runs in the kernels."""
    mask, form, _ = _accepted()[name]
    q, k, v = _qkv()
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    full = KeyPaddingRouter(AttentionRouter(AttentionPlan.uniform("full")), {"layer": form})
    quantized = KeyPaddingRouter(AttentionRouter(AttentionPlan.uniform("int8-fp16"), "reference"), {"layer": form})
    with sagevideo.record_backends() as log:
        got = full("layer", q, k, v, attn_mask=mask)
        close = quantized("layer", q, k, v, attn_mask=mask)
    assert (got - want).abs().max() < 1e-6
    assert F.cosine_similarity(close.flatten(), want.flatten(), dim=0) > 0.999
    assert log.counts == {"sdpa": 1, "reference/fp16": 1} and log.fallback_reasons == {}


@pytest.mark.parametrize("name", sorted(_rejected()))
def test_masks_that_are_not_key_padding_run_sdpa_with_the_reason(name):
    mask, form, reason = _rejected()[name]
    q, k, v = _qkv()
    router = KeyPaddingRouter(AttentionRouter(AttentionPlan.uniform("int8-fp16"), "reference"), {"layer": form})
    with sagevideo.record_backends() as log:
        got = router("layer", q, k, v, attn_mask=mask)
    assert torch.equal(got, F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
    (recorded,) = log.fallback_reasons
    assert log.counts == {"sdpa": 1} and reason in recorded


def test_only_the_declared_layers_are_read_and_key_masks_cost_nothing(monkeypatch):
    import sagevideo.pipelines.masks as masks

    factored = []
    monkeypatch.setattr(masks, "factor", lambda *a: factored.append(1) or factor(*a))
    router = KeyPaddingRouter(AttentionRouter(AttentionPlan.uniform("int8-fp16"), "reference"),
                              {"declared": KeyPadding()})
    q, k, v = _qkv()
    with sagevideo.record_backends() as log:
        router("other", q, k, v, attn_mask=_outer(KEYS, KEYS))  # not the family's: as it came
        router("declared", q, k, v, attn_mask=KEYS[:, None, None, :].expand(B, H, N, N))  # a broadcast view
        router("declared", q, k, v)
    assert log.counts == {"sdpa": 1, "reference/fp16": 2} and factored == []
