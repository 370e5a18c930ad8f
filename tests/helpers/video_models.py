"""Tiny diffusers video transformers that no built-in tiny model covers, each with one forward's
inputs: HunyuanVideo 1.5, LTX-Video, LTX-2, HunyuanVideo-Framepack, Latte and EasyAnimate (fp32, eval,
weights from a fixed seed, the global RNG untouched). Texts are padded: `VALID_TEXT` of `TEXT` tokens
are real, so the models' text masks mask keys.

`MODELS[name]` is (transformer class name, config, inputs(seed) -> forward kwargs).
"""

from __future__ import annotations

import torch

TEXT, VALID_TEXT = 6, 4


def _text_mask(tokens: int = TEXT, valid: int = VALID_TEXT) -> torch.Tensor:
    mask = torch.zeros(1, tokens)
    mask[:, :valid] = 1
    return mask


def _hunyuanvideo15(gen):
    return dict(hidden_states=torch.randn(1, 4, 2, 4, 4, generator=gen), timestep=torch.tensor([500.0]),
                encoder_hidden_states=torch.randn(1, TEXT, 16, generator=gen), encoder_attention_mask=_text_mask(),
                encoder_hidden_states_2=torch.randn(1, 5, 16, generator=gen), encoder_attention_mask_2=_text_mask(5, 2),
                image_embeds=torch.zeros(1, 3, 16))


def _ltx(gen):
    return dict(hidden_states=torch.randn(1, 2 * 4 * 4, 4, generator=gen),
                encoder_hidden_states=torch.randn(1, TEXT, 16, generator=gen), timestep=torch.tensor([500.0]),
                encoder_attention_mask=_text_mask(), num_frames=2, height=4, width=4)


def _ltx2(gen):
    return dict(hidden_states=torch.randn(1, 2 * 4 * 4, 4, generator=gen),
                audio_hidden_states=torch.randn(1, 5, 4, generator=gen),
                encoder_hidden_states=torch.randn(1, TEXT, 16, generator=gen),
                audio_encoder_hidden_states=torch.randn(1, TEXT, 16, generator=gen), timestep=torch.tensor([500.0]),
                encoder_attention_mask=_text_mask(), audio_encoder_attention_mask=_text_mask(),
                num_frames=2, height=4, width=4, audio_num_frames=5)


def _framepack(gen):
    return dict(hidden_states=torch.randn(1, 4, 2, 8, 8, generator=gen), timestep=torch.tensor([500.0]),
                encoder_hidden_states=torch.randn(1, TEXT, 32, generator=gen), encoder_attention_mask=_text_mask(),
                pooled_projections=torch.randn(1, 32, generator=gen), image_embeds=torch.randn(1, 3, 16, generator=gen),
                indices_latents=torch.arange(2), guidance=torch.tensor([6000.0]),
                # the history Framepack conditions on (its forward needs all of it): 1 clean frame, 2 and 4 older
                latents_clean=torch.randn(1, 4, 1, 8, 8, generator=gen), indices_latents_clean=torch.arange(1),
                latents_history_2x=torch.randn(1, 4, 2, 8, 8, generator=gen),
                indices_latents_history_2x=torch.arange(2),
                latents_history_4x=torch.randn(1, 4, 4, 8, 8, generator=gen),
                indices_latents_history_4x=torch.arange(4))


def _latte(gen):
    return dict(hidden_states=torch.randn(1, 4, 2, 8, 8, generator=gen), timestep=torch.tensor([500]),
                encoder_hidden_states=torch.randn(1, TEXT, 16, generator=gen))


def _easyanimate(gen):
    return dict(hidden_states=torch.randn(1, 4, 2, 8, 8, generator=gen), timestep=torch.tensor([500]),
                encoder_hidden_states=torch.randn(1, TEXT, 16, generator=gen))


MODELS = {
    "hunyuanvideo15": ("HunyuanVideo15Transformer3DModel", dict(
        in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=32, num_layers=2,
        num_refiner_layers=1, text_embed_dim=16, text_embed_2_dim=16, image_embed_dim=16, rope_axes_dim=(8, 12, 12),
    ), _hunyuanvideo15),
    "ltx": ("LTXVideoTransformer3DModel", dict(
        in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=8, cross_attention_dim=16,
        num_layers=1, caption_channels=16,
    ), _ltx),
    "ltx2": ("LTX2VideoTransformer3DModel", dict(
        in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=8, cross_attention_dim=16,
        audio_in_channels=4, audio_out_channels=4, audio_num_attention_heads=2, audio_attention_head_dim=8,
        audio_cross_attention_dim=16, num_layers=1, caption_channels=16,
    ), _ltx2),
    "framepack": ("HunyuanVideoFramepackTransformer3DModel", dict(
        in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=16, num_layers=1, num_single_layers=1,
        num_refiner_layers=1, text_embed_dim=32, pooled_projection_dim=32, rope_axes_dim=(4, 6, 6),
        has_image_proj=True, image_proj_dim=16, has_clean_x_embedder=True,
    ), _framepack),
    "latte": ("LatteTransformer3DModel", dict(
        num_attention_heads=2, attention_head_dim=8, in_channels=4, out_channels=4, num_layers=1,
        cross_attention_dim=16, sample_size=8, patch_size=2, num_embeds_ada_norm=1000, norm_type="ada_norm_single",
        caption_channels=16, video_length=2,
    ), _latte),
    "easyanimate": ("EasyAnimateTransformer3DModel", dict(
        num_attention_heads=2, attention_head_dim=16, in_channels=4, out_channels=4, patch_size=2, sample_width=8,
        sample_height=8, num_layers=1, mmdit_layers=1, time_embed_dim=16, text_embed_dim=16,
    ), _easyanimate),
}


def tiny_model(name: str, seed: int = 0):
    """The tiny transformer `name` (a key of MODELS), fp32, eval mode, weights from `seed`."""
    import diffusers

    cls, config, _ = MODELS[name]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return getattr(diffusers, cls)(**config).eval()


def model_inputs(name: str, seed: int = 1) -> dict:
    """One forward's keyword arguments for `tiny_model(name)` (return_dict=False)."""
    return dict(MODELS[name][2](torch.Generator().manual_seed(seed)), return_dict=False)


def run_model(model, name: str, **changes) -> torch.Tensor:
    """The video prediction of one forward of `tiny_model(name)` (inputs as `model_inputs`, with `changes`)."""
    with torch.no_grad():
        return model(**{**model_inputs(name), **changes})[0]
