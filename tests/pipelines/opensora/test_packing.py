"""Patchify order (OPENSORA.md §6): tokens t-major then h then w; feature = c*4 + ph*2 + pw."""

import torch

from sagevideo.pipelines.opensora.packing import latent_ids, pack_condition, pack_latents, unpack_latents


def test_round_trip():
    x = torch.randn(2, 16, 3, 6, 8)
    packed = pack_latents(x)
    assert packed.shape == (2, 3 * 3 * 4, 64)
    assert torch.equal(unpack_latents(packed, 3, 6, 8), x)


def test_token_and_feature_order():
    b, c, t, h, w = 1, 3, 2, 4, 6
    x = torch.randn(b, c, t, h, w)
    packed = pack_latents(x)
    ids = latent_ids(b, t, h, w)
    for token in range(packed.shape[1]):
        tt, hh, ww = (int(v) for v in ids[0, token])
        # t-major, then h, then w
        assert token == (tt * (h // 2) + hh) * (w // 2) + ww
        for ch in range(c):
            for ph in range(2):
                for pw in range(2):
                    assert packed[0, token, ch * 4 + ph * 2 + pw] == x[0, ch, tt, 2 * hh + ph, 2 * ww + pw]


def test_single_frame_equals_diffusers_flux_pack():
    from diffusers import FluxPipeline

    x = torch.randn(2, 16, 1, 6, 8)
    want = FluxPipeline._pack_latents(x[:, :, 0], 2, 16, 6, 8)
    assert torch.equal(pack_latents(x), want)


def test_condition_mask_occupies_features_0_to_3():
    mask = torch.ones(1, 1, 2, 4, 4)
    ref = torch.zeros(1, 16, 2, 4, 4)
    cond = pack_condition(mask, ref)
    assert cond.shape == (1, 2 * 2 * 2, 68)
    assert torch.all(cond[..., :4] == 1) and torch.all(cond[..., 4:] == 0)
