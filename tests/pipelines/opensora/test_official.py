"""The official download -> the diffusers-style folder (`convert_official_folder`): a tiny stand-in
laid out as hpcai-tech/Open-Sora-v2 converts into a folder that loads through `--model`, and its
parts compute what the official parts do; missing or misfitting parts are named before anything is written."""

from __future__ import annotations

import json

import pytest
import torch

from sagevideo.errors import InputError
from sagevideo.pipelines.opensora import tiny
from sagevideo.pipelines.opensora.official import ConvertOpenSoraConfig, convert_official_folder, convert_opensora
from tests.helpers.opensora import reference_forward, write_official_download

TINY_CONFIGS = dict(transformer_config=tiny.TRANSFORMER_CONFIG, vae_config=tiny.VAE_CONFIG)


@pytest.fixture(scope="module")
def download(tmp_path_factory):
    root = tmp_path_factory.mktemp("official")
    return root, write_official_download(root)


@pytest.fixture(scope="module")
def converted(download, tmp_path_factory):
    root, _ = download
    out = tmp_path_factory.mktemp("converted") / "opensora"
    lines = []
    convert_official_folder(root, out, dtype="float32", log=lines.append, **TINY_CONFIGS)
    return out, lines


def test_the_converted_folder_is_a_diffusers_style_opensora_folder(converted):
    out, lines = converted
    index = json.loads((out / "model_index.json").read_text())
    assert index["_class_name"] == "OpenSoraPipeline"
    assert index["transformer"] == ["sagevideo.pipelines.opensora.transformer", "OpenSoraTransformer3DModel"]
    assert index["vae"] == ["diffusers", "AutoencoderKLHunyuanVideo"]
    assert index["text_encoder"] == ["transformers", "T5EncoderModel"]
    assert index["text_encoder_2"] == ["transformers", "CLIPTextModel"]
    assert index["scheduler"] == ["diffusers", "FlowMatchEulerDiscreteScheduler"]
    assert not out.with_name(out.name + ".partial").exists()
    assert [line.split(":")[0] for line in lines] == [
        "transformer", "vae", "text_encoder, tokenizer", "text_encoder_2, tokenizer_2", f"wrote {out}"]


def test_the_loaded_parts_compute_what_the_official_parts_do(download, converted):
    """Reference: the official forward written from OPENSORA.md on the OFFICIAL state dict
    (`tests.helpers.opensora.reference_forward`), the T5 encoder of the whole released T5, and the
    text tower of the whole CLIP."""
    from transformers import CLIPModel, T5ForConditionalGeneration

    from sagevideo.pipelines.loading import load_pipeline, resolve_model
    from sagevideo.pipelines.opensora.packing import latent_ids, text_ids

    root, official = download
    source = resolve_model(str(converted[0]))
    assert source.family == "opensora" and not source.is_tiny and source.default_fps == 24
    pipe = load_pipeline(source, "cpu", torch.float32)
    g = torch.Generator().manual_seed(3)
    cfg = tiny.TRANSFORMER_CONFIG
    img = torch.randn(1, 2 * 2 * 3, cfg["in_channels"], generator=g)
    inputs = dict(img=img, img_ids=latent_ids(1, 2, 4, 6), txt=torch.randn(1, 7, cfg["context_in_dim"], generator=g),
                  txt_ids=text_ids(1, 7), timesteps=torch.tensor([0.7]),
                  y_vec=torch.randn(1, cfg["vec_in_dim"], generator=g),
                  cond=torch.randn(1, 12, cfg["cond_in_channels"], generator=g))
    with torch.no_grad():
        got = pipe.transformer(**inputs)
        want = reference_forward(official, cfg, **inputs)
        torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)
        ids = pipe.tokenizer(["a cat"], return_tensors="pt").input_ids
        t5 = T5ForConditionalGeneration.from_pretrained(root / "google" / "t5-v1_1-xxl").eval()
        assert torch.equal(pipe.text_encoder(ids).last_hidden_state, t5.encoder(ids).last_hidden_state)
        clip = CLIPModel.from_pretrained(root / "openai" / "clip-vit-large-patch14").eval()
        assert torch.equal(pipe.text_encoder_2(ids).pooler_output, clip.text_model(ids).pooler_output)
    from safetensors.torch import load_file

    vae = load_file(str(root / "hunyuan_vae.safetensors"))
    assert all(torch.equal(pipe.vae.state_dict()[k], v) for k, v in vae.items())


def test_missing_parts_are_named_all_at_once(tmp_path, download):
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError) as err:
        convert_official_folder(tmp_path / "empty", tmp_path / "out")
    message = str(err.value)
    for part in ("the MMDiT checkpoint", "the HunyuanVideo VAE checkpoint", "the T5-v1.1-XXL folder",
                 "the CLIP ViT-L/14 folder"):
        assert part in message
    assert "nothing is downloaded" in message and not (tmp_path / "out").exists()
    root, _ = download
    with pytest.raises(InputError, match=r"the MMDiT checkpoint: .*model\.pt is not a \.safetensors file"):
        (tmp_path / "model.pt").write_bytes(b"")
        convert_official_folder(root, tmp_path / "out", transformer=tmp_path / "model.pt")


def test_an_existing_folder_is_not_overwritten(tmp_path, download):
    root, _ = download
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("mine")
    with pytest.raises(InputError, match="exists and is not an empty folder"):
        convert_official_folder(root, tmp_path / "out", **TINY_CONFIGS)
    assert (tmp_path / "out" / "keep.txt").read_text() == "mine"


def test_a_checkpoint_of_another_config_is_refused_by_key_and_nothing_is_left(tmp_path, download):
    """The released config (the default) against the tiny checkpoint: every key of the wrong shape is named."""
    root, _ = download
    with pytest.raises(InputError) as err:
        convert_opensora(source=root, out=tmp_path / "out")
    message = str(err.value)
    assert "does not match the model config (official key names)" in message
    assert "61 wrong shape: cond_in.bias: expected (3072,), got (128,)" in message
    assert "double_blocks.0.img_attn.norm.key_norm.scale: expected (128,), got (64,)" in message  # head dim 64
    assert "1020 missing: double_blocks.1." in message and "is it the official Open_Sora_v2.safetensors?" in message
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.partial").exists()


def test_the_config_names_every_bad_option():
    with pytest.raises(InputError) as err:
        ConvertOpenSoraConfig.build(source="a", out="b", dtype="int8", colour="red")
    assert "dtype" in str(err.value) and "colour" in str(err.value)
