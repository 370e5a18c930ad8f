"""Sampling schedule shift, the three-branch guidance and its oscillation (OPENSORA.md §3, §6; the
official sampler's rules)."""

import math

import torch

from sagevideo.pipelines.opensora.schedule import combine_guidance, opensora_sigmas, oscillated_scale, shift_alpha


def test_shift_alpha_and_sigmas():
    assert shift_alpha(256, 1) == 1.0
    assert math.isclose(shift_alpha(4096, 33), 3 * math.sqrt(33))
    assert math.isclose(shift_alpha(256, 33), math.sqrt(33))  # 256px 1:1 at 129 frames
    s = opensora_sigmas(50, 252, 33)
    assert s.shape == (51,) and s[0] == 1 and s[-1] == 0 and torch.all(s[1:] < s[:-1])
    alpha = shift_alpha(252, 33)
    t = torch.linspace(1, 0, 51)
    torch.testing.assert_close(s, alpha * t / (1 + (alpha - 1) * t))
    torch.testing.assert_close(opensora_sigmas(4, 256, 1), torch.linspace(1, 0, 5))  # alpha 1: plain linspace


def test_guidance_formula():
    c, u, u2 = torch.randn(3, 5).unbind()
    got = combine_guidance(c, u, u2, text_scale=7.5, image_scale=3.0)
    torch.testing.assert_close(got, u2 + 3.0 * (u - u2) + 7.5 * (c - u))
    # text-to-video: u == u2, so it is plain CFG
    torch.testing.assert_close(combine_guidance(c, u, u, 7.5, 3.0), u + 7.5 * (c - u))


def test_guidance_oscillation_of_the_official_configs():
    """text_osci/image_osci: at 50 steps, 1.0 at steps 11, 13, ..., 49; the scale everywhere else."""
    scales = [oscillated_scale(7.5, i) for i in range(50)]
    assert [i for i, g in enumerate(scales) if g == 1.0] == list(range(11, 50, 2))
    assert all(g == 7.5 for i, g in enumerate(scales) if i < 10 or i % 2 == 0)


def test_temporal_image_scale_of_the_official_i2v_sampler():
    """scale_temporal_osci: g_img rises over the latent frames from 1 to a bound that falls from g_img
    to 1 over the steps (values of the official linspace(g_img, 1, steps + 1)[i], linspace(1, bound, T))."""
    from sagevideo.pipelines.opensora.schedule import temporal_image_scale

    assert torch.equal(temporal_image_scale(3.0, 0, 50, 5), torch.tensor([1.0, 1.5, 2.0, 2.5, 3.0]))
    bound = 3.0 - 2.0 * 10 / 50  # step 10 of 50
    torch.testing.assert_close(temporal_image_scale(3.0, 10, 50, 33)[-1], torch.tensor(bound))
    assert torch.equal(temporal_image_scale(3.0, 50, 50, 33), torch.ones(33))
    assert temporal_image_scale(3.0, 0, 50, 1).tolist() == [1.0]  # one latent frame: the image's own
