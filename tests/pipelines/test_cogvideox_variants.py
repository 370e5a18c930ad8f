"""The CogVideoX variants install the same way: image-to-video (doubled input channels, learned
positional embeddings off) and CogVideoX 1.5 (temporal patches, ofs embedding), transformer level."""

import pytest
import torch

import sagevideo
from sagevideo.pipelines.cogvideox.tiny import TRANSFORMER_CONFIG

VARIANTS = {
    "i2v": dict(TRANSFORMER_CONFIG, in_channels=8, use_learned_positional_embeddings=False),
    "1.5": dict(TRANSFORMER_CONFIG, patch_size_t=2, ofs_embed_dim=32, sample_frames=17,
                use_learned_positional_embeddings=False),
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_variant_installs_routes_and_restores(variant):
    from diffusers import CogVideoXTransformer3DModel
    from diffusers.models.embeddings import get_3d_rotary_pos_embed

    cfg = VARIANTS[variant]
    torch.manual_seed(0)
    model = CogVideoXTransformer3DModel(**cfg).eval()
    frames = 4 if cfg.get("patch_size_t") else 3
    h, w, p = cfg["sample_height"], cfg["sample_width"], cfg["patch_size"]
    gen = torch.Generator().manual_seed(1)
    rope_frames = frames // cfg.get("patch_size_t", 1) if cfg.get("patch_size_t") else frames
    rotary = get_3d_rotary_pos_embed(cfg["attention_head_dim"], ((0, 0), (h // p, w // p)), (h // p, w // p),
                                     rope_frames)
    kwargs = dict(
        hidden_states=torch.randn(1, frames, cfg["in_channels"], h, w, generator=gen),
        encoder_hidden_states=torch.randn(1, 16, cfg["text_embed_dim"], generator=gen),
        timestep=torch.tensor([10]), image_rotary_emb=rotary, return_dict=False,
    )
    if cfg.get("ofs_embed_dim"):
        kwargs["ofs"] = torch.tensor([2.0])
    with torch.no_grad():
        before = model(**kwargs)[0]
        with sagevideo.install(model, backend="reference") as handle, sagevideo.record_backends() as log:
            quant = model(**kwargs)[0]
        after = model(**kwargs)[0]
    assert handle.processors and log.counts == {"reference/fp16": cfg["num_layers"]}
    assert torch.nn.functional.cosine_similarity(before.flatten(), quant.flatten(), dim=0) > 0.9999
    assert torch.equal(after, before)
