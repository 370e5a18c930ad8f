"""Dispatcher-based transformers (here a tiny Wan): SDPA is intercepted only inside the
transformer's forward, layer names reach the plan, and remove() restores bit-identical outputs."""

import os

import pytest
import torch
import torch.nn.functional as F

import sagevideo
from sagevideo.pipelines.plans import AttentionPlan, Choice, Mode, Override


@pytest.fixture(scope="module")
def wan():
    from diffusers import WanTransformer3DModel

    torch.manual_seed(0)
    model = WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=64, in_channels=4, out_channels=4,
        text_dim=16, freq_dim=256, ffn_dim=32, num_layers=2, cross_attn_norm=True,
        qk_norm="rms_norm_across_heads", rope_max_seq_len=32,
    ).eval()
    gen = torch.Generator().manual_seed(1)
    inputs = (torch.randn(1, 4, 3, 8, 8, generator=gen), torch.tensor([500]), torch.randn(1, 10, 16, generator=gen))
    return model, inputs


def _run(model, inputs):
    with torch.no_grad():
        return model(*inputs, return_dict=False)[0]


def test_interception_routes_every_layer_and_removes_cleanly(wan):
    model, inputs = wan
    before = _run(model, inputs)
    with sagevideo.install(model, backend="reference") as handle, sagevideo.record_backends() as log:
        assert handle.interception is not None and handle.processors == {}
        out = _run(model, inputs)
    assert log.counts == {"reference/fp16": 4}  # 2 blocks x (self + cross attention)
    assert torch.nn.functional.cosine_similarity(before.flatten(), out.flatten(), dim=0) > 0.9999
    assert not torch.equal(before, out)
    assert "forward" not in vars(model)
    assert torch.equal(_run(model, inputs), before)


def test_sdpa_outside_the_transformer_is_untouched(wan):
    model, _ = wan
    q = torch.randn(1, 2, 8, 64)
    with sagevideo.install(model, backend="reference"), sagevideo.record_backends() as log:
        F.scaled_dot_product_attention(q, q, q)  # e.g. a text encoder or VAE between transformer calls
    assert log.counts == {}


def test_plan_reaches_intercepted_layers_by_name(wan):
    model, inputs = wan
    layers = tuple(k.removesuffix(".processor") for k in model.attn_processors)
    plan = AttentionPlan(
        layers=layers, default=Choice(mode=Mode.int8_fp8),
        overrides=(Override(layers=("blocks.0.attn2", "blocks.1.attn2"), mode=Mode.full),),
    )
    with sagevideo.install(model, plan, backend="reference"), sagevideo.record_backends() as log:
        _run(model, inputs)
    assert log.counts == {"reference/fp8": 2, "sdpa": 2}


class _GroupedQueryModel(torch.nn.Module):
    """The least a dispatcher model has for install(): attention modules with processors; its
    attention calls SDPA with grouped-query heads, then with dropout."""

    class Attention(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.processor = object()

        def forward(self, q, k, v):
            grouped = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
            dropped = F.scaled_dot_product_attention(q, q, q, dropout_p=0.5)
            return grouped, dropped

    def __init__(self):
        super().__init__()
        self.attn = self.Attention()
        self.proj = torch.nn.Linear(4, 4)  # install() reads the model's device from its parameters

    @property
    def attn_processors(self):
        return {"attn.processor": self.attn.processor}

    def set_attn_processor(self, processors):
        self.attn.processor = processors["attn.processor"]

    def forward(self, q, k, v):
        return self.attn(q, k, v)


def test_intercepted_calls_keep_every_sdpa_argument(monkeypatch):
    """Grouped-query calls used to bypass sagevideo silently (0 routed); they now run in the kernels'
    index math, and dropout runs SDPA as asked, recorded as a fallback with its reason."""
    monkeypatch.setattr(sagevideo.attention.functional, "_warned", set())  # each fallback reason warns once a process
    model = _GroupedQueryModel()
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, 4, 64, 64, generator=gen).half()
    k, v = (torch.randn(1, 2, 64, 64, generator=gen).half() for _ in range(2))
    with sagevideo.install(model), sagevideo.record_backends() as log, pytest.warns(UserWarning, match="dropout"):
        grouped, _ = model(q, k, v)
    kernel = "triton" if torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1" else "sdpa"
    assert log.counts == ({f"{kernel}/fp16": 1, "sdpa": 1} if kernel == "triton" else {"sdpa": 2})
    assert "dropout_p=0.5: the kernels compute no dropout" in log.fallback_reasons
    want = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), enable_gqa=True)
    assert F.cosine_similarity(want.flatten(), grouped.float().flatten(), dim=0) > 0.999
    # an explicitly requested quantized backend refuses what it cannot compute
    with sagevideo.install(model, backend="reference"), pytest.raises(ValueError, match="dropout"):
        model(q, k, v)
