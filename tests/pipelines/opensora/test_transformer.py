"""The transformer against an independent implementation of OPENSORA.md §4 on official weights."""

import pytest
import torch

from sagevideo.pipelines.opensora import OpenSoraTransformer3DModel
from sagevideo.pipelines.opensora.rope import rope_tables
from tests.helpers.opensora import (
    TINY,
    ref_double_block,
    ref_rope_angles,
    ref_single_block,
    reference_forward,
    tiny_inputs,
)

TOL = dict(atol=2e-5, rtol=2e-5)  # fp32, different op order (explicit softmax, hand-written norms)


def _block_inputs(seed=3, txt_len=5, frames=2, h=2, w=3):
    g = torch.Generator().manual_seed(seed)
    ids = torch.tensor([(0, 0, 0)] * txt_len + [(t, i, j) for t in range(frames) for i in range(h) for j in range(w)],
                       dtype=torch.float32)[None].expand(2, -1, -1)
    n_img = frames * h * w
    return (torch.randn(2, n_img, 64, generator=g), torch.randn(2, txt_len, 64, generator=g),
            torch.randn(2, 64, generator=g), ids)


def test_double_block_equals_reference(tiny_model, official_sd):
    img, txt, vec, ids = _block_inputs()
    rotary = rope_tables(ids, TINY["axes_dim"], TINY["theta"])
    angles = ref_rope_angles(ids[0], TINY["axes_dim"], TINY["theta"])
    with torch.no_grad():
        got_img, got_txt = tiny_model.transformer_blocks[0](img, txt, vec, rotary)
    want_img, want_txt = ref_double_block(official_sd, 0, img, txt, vec, angles, heads=2)
    torch.testing.assert_close(got_img, want_img, **TOL)
    torch.testing.assert_close(got_txt, want_txt, **TOL)


def test_single_block_equals_reference(tiny_model, official_sd):
    img, txt, vec, ids = _block_inputs(seed=4)
    x = torch.cat([txt, img], dim=1)
    rotary = rope_tables(ids, TINY["axes_dim"], TINY["theta"])
    angles = ref_rope_angles(ids[0], TINY["axes_dim"], TINY["theta"])
    with torch.no_grad():
        got_img, got_txt = tiny_model.single_transformer_blocks[0](img, txt, vec, rotary)
    want = ref_single_block(official_sd, 0, x, vec, angles, heads=2)  # the official block: x = [txt; img] joined
    torch.testing.assert_close(got_txt, want[:, :txt.shape[1]], **TOL)
    torch.testing.assert_close(got_img, want[:, txt.shape[1]:], **TOL)


def test_full_forward_equals_reference(tiny_model, official_sd):
    inputs = tiny_inputs()
    with torch.no_grad():
        got = tiny_model(**inputs)
    assert got.shape == inputs["img"].shape and got.dtype == torch.float32
    torch.testing.assert_close(got, reference_forward(official_sd, TINY, **inputs), **TOL)


def test_cond_bias_is_added_for_zero_cond(tiny_model):
    """Text-to-video passes cond = 0, and cond_in's bias still enters (it is not the same as no cond_in)."""
    inputs = tiny_inputs()
    inputs["cond"] = torch.zeros_like(inputs["cond"])
    with torch.no_grad():
        base = tiny_model(**inputs)
        bias = tiny_model.cond_embedder.bias.detach().clone()
        tiny_model.cond_embedder.bias.zero_()
        try:
            changed = tiny_model(**inputs)
        finally:
            tiny_model.cond_embedder.bias.copy_(bias)
    assert not torch.allclose(base, changed)
    with pytest.raises(ValueError, match="cond is required"):
        tiny_model(**{**inputs, "cond": None})


def test_final_layer_is_shift_first(tiny_model, official_sd):
    """Rows 0:C of adaLN_modulation.1 are the shift: with scale rows zeroed, out = LN(x) + shift."""
    x = torch.randn(1, 4, 64)
    vec = torch.randn(1, 64)
    with torch.no_grad():
        got = tiny_model.norm_out(x, vec)
    lin = official_sd["final_layer.adaLN_modulation.1.weight"], official_sd["final_layer.adaLN_modulation.1.bias"]
    mod = torch.nn.functional.silu(vec) @ lin[0].T + lin[1]
    shift, scale = mod[:, None, :64], mod[:, None, 64:]
    want = (1 + scale) * torch.nn.functional.layer_norm(x, (64,), eps=1e-6) + shift
    torch.testing.assert_close(got, want, **TOL)


def test_released_config_defaults_and_refusals():
    with torch.device("meta"):
        model = OpenSoraTransformer3DModel()
    cfg = model.config
    assert (cfg.in_channels, cfg.vec_in_dim, cfg.context_in_dim, cfg.hidden_size, cfg.num_heads) == (
        64, 768, 4096, 3072, 24)
    assert (cfg.depth, cfg.depth_single_blocks, list(cfg.axes_dim), cfg.theta, cfg.cond_in_channels) == (
        19, 38, [16, 56, 56], 10000, 68)
    assert sum(p.numel() for p in model.parameters()) == 11_891_390_528  # OPENSORA.md §1: 11.891 B
    for bad in (dict(guidance_embed=True), dict(use_liger_rope=False), dict(fused_qkv=True)):
        with pytest.raises(NotImplementedError):
            OpenSoraTransformer3DModel(**{**TINY, **bad})
    with pytest.raises(ValueError, match="axes_dim"):
        OpenSoraTransformer3DModel(**{**TINY, "axes_dim": [8, 12, 14]})


def test_save_pretrained_from_pretrained_round_trip(tiny_model, tmp_path):
    tiny_model.save_pretrained(tmp_path, safe_serialization=True)
    assert (tmp_path / "diffusion_pytorch_model.safetensors").is_file() and (tmp_path / "config.json").is_file()
    loaded = OpenSoraTransformer3DModel.from_pretrained(tmp_path, local_files_only=True).eval()
    public = lambda cfg: {k: v for k, v in cfg.items() if not k.startswith("_")}
    assert public(loaded.config) == public(tiny_model.config)
    inputs = tiny_inputs()
    with torch.no_grad():
        assert torch.equal(loaded(**inputs), tiny_model(**inputs))
