"""sagevideo's CogVideoX processor vs diffusers' CogVideoXAttnProcessor2_0.

With sageattn's "sdpa" backend the two must agree exactly: a mismatch means upstream changed
the processor and the copy in sagevideo/pipelines/cogvideox/processor.py must follow.
"""

import pytest
import torch
from diffusers.models.attention_processor import CogVideoXAttnProcessor2_0

from sagevideo.attention.records import record_backends
from sagevideo.pipelines.cogvideox.processor import SageCogVideoXAttnProcessor


def _inputs(batch=2, n_text=16, n_video=48, dim=128, head_dim=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(batch, n_video, dim, generator=g)
    text = torch.randn(batch, n_text, dim, generator=g)
    angles = torch.rand(n_video, head_dim, generator=g) * 6.3
    return hidden, text, (angles.cos(), angles.sin())


def _run(attn, processor, hidden, text, **kwargs):
    attn.set_processor(processor)
    with torch.no_grad():
        return attn(hidden_states=hidden.clone(), encoder_hidden_states=text.clone(), **kwargs)


@pytest.fixture
def attn(tiny_pipe):
    """The first attention module of the tiny transformer, with its processor restored afterwards."""
    module = tiny_pipe.transformer.transformer_blocks[0].attn1
    original = module.processor
    yield module
    module.set_processor(original)


@pytest.mark.parametrize("rotary", [True, False])
def test_matches_upstream_exactly_on_sdpa(attn, rotary):
    hidden, text, rope = _inputs()
    kwargs = {"image_rotary_emb": rope} if rotary else {}
    want = _run(attn, CogVideoXAttnProcessor2_0(), hidden, text, **kwargs)
    with record_backends() as log:
        got = _run(attn, SageCogVideoXAttnProcessor(backend="sdpa"), hidden, text, **kwargs)
    assert log.counts == {"sdpa": 1}
    for w, g in zip(want, got, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype
        assert torch.equal(g, w)


@pytest.mark.parametrize("dtype", [torch.bool, torch.float32])
def test_matches_upstream_with_key_padding_mask(attn, dtype):
    hidden, text, rope = _inputs()
    keep = torch.ones(2, 16 + 48, dtype=torch.bool)
    keep[0, 10:16] = False  # padded text tokens of the first prompt
    mask = keep if dtype == torch.bool else torch.zeros(keep.shape).masked_fill(~keep, float("-inf"))
    want = _run(attn, CogVideoXAttnProcessor2_0(), hidden, text, attention_mask=mask, image_rotary_emb=rope)
    got = _run(
        attn,
        SageCogVideoXAttnProcessor(backend="sdpa"),
        hidden,
        text,
        attention_mask=mask,
        image_rotary_emb=rope,
    )
    for w, g in zip(want, got, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-6)


def test_bool_key_padding_mask_reaches_the_quantized_path(attn):
    hidden, text, rope = _inputs()
    keep = torch.ones(2, 64, dtype=torch.bool)
    keep[1, 12:16] = False
    with record_backends() as log:
        _run(
            attn,
            SageCogVideoXAttnProcessor(backend="reference"),
            hidden,
            text,
            attention_mask=keep,
            image_rotary_emb=rope,
        )
    assert log.counts == {"reference/fp16": 1}  # not a fallback: the mask was handed over as (B, 1, 1, Nk)


@pytest.mark.parametrize("pv", ["fp16", "fp8"])
def test_quantized_processor_is_close_to_upstream(attn, pv):
    hidden, text, rope = _inputs(seed=1)
    want = _run(attn, CogVideoXAttnProcessor2_0(), hidden, text, image_rotary_emb=rope)
    got = _run(
        attn, SageCogVideoXAttnProcessor(pv=pv, backend="reference"), hidden, text, image_rotary_emb=rope
    )
    for w, g in zip(want, got, strict=True):
        assert torch.isfinite(g).all()
        cos = torch.nn.functional.cosine_similarity(g.flatten(), w.flatten(), dim=0)
        assert cos > 0.998, cos


def test_rejects_unknown_options():
    with pytest.raises(ValueError, match="pv='int4'"):
        SageCogVideoXAttnProcessor(pv="int4")
    with pytest.raises(ValueError, match="backend='cuda'"):
        SageCogVideoXAttnProcessor(backend="cuda")


@pytest.mark.slow  # torch.compile of the tiny transformer
@pytest.mark.parametrize("compile_backend", ["eager", "inductor"])  # inductor runs AOTAutograd (aot_eager's part)
def test_regional_compile_with_sagevideo_processors_is_clean(compile_backend):
    """Each block compiled: no graph beyond the stock model's, no break, outputs as eager, every call recorded."""
    from tests.helpers.regional_compile import check_regional_compile

    check_regional_compile("tiny-cogvideox", compile_backend, exact=compile_backend == "eager")
