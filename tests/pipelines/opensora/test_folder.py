"""Open-Sora folders: detection names every missing part before loading, an official download is
refused with the conversion command, and the tiny model saved with `save_pretrained` loads back
through exactly the path real folders take (`resolve_model` -> `load_pipeline`) and makes the same video."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

import sagevideo
from sagevideo.errors import InputError
from sagevideo.pipelines.loading import load_pipeline, resolve_model


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """The built-in tiny-opensora, saved as a folder."""
    from sagevideo.pipelines.opensora.tiny import tiny_pipeline

    folder = tmp_path_factory.mktemp("saved") / "tiny-opensora"
    tiny_pipeline().save_pretrained(folder, safe_serialization=True)
    return folder


def test_a_saved_tiny_model_is_detected_from_its_configs(saved):
    index = json.loads((saved / "model_index.json").read_text())
    assert index["_class_name"] == "OpenSoraPipeline"
    source, tiny = resolve_model(str(saved)), resolve_model("tiny-opensora")
    assert source.family == "opensora" and not source.is_tiny and source.path == saved
    for field in ("heads", "head_dim", "spatial", "temporal", "patch", "text_tokens", "layers", "default_fps"):
        assert getattr(source, field) == getattr(tiny, field), field
    assert source.attention_layers == tiny.attention_layers
    # a folder's defaults are the official sampler's: 256px 16:9, 129 frames, 50 steps
    assert (source.default_width, source.default_height, source.default_frames, source.default_steps) == (
        336, 192, 129, 50)


def test_the_saved_folder_makes_the_tiny_models_video(saved, tmp_path):
    """Through `sagevideo.generate(model=FOLDER)`: the same mp4 bytes as the built-in model (same
    weights, fp32), from a model loaded as real folders are."""
    pipe = load_pipeline(resolve_model(str(saved)), "cpu", torch.float32)
    built = load_pipeline(resolve_model("tiny-opensora"), "cpu", torch.float32)
    for name in ("transformer", "vae", "text_encoder", "text_encoder_2"):
        a, b = getattr(pipe, name).state_dict(), getattr(built, name).state_dict()
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), name
    job = dict(resolution="48x32", frames=5, steps=1, output="clip")
    folder = sagevideo.generate([dict(prompt="a lighthouse at dusk", **job)], model=str(saved),
                                out=tmp_path / "folder", device="cpu", progress=False)
    built = sagevideo.generate([dict(prompt="a lighthouse at dusk", **job)], model="tiny-opensora",
                               out=tmp_path / "built", device="cpu", progress=False)
    assert [r["status"] for r in folder + built] == ["done", "done"]
    assert folder[0]["model"] == str(saved) and folder[0]["family"] == "opensora" and folder[0]["fps"] == 24
    assert (tmp_path / "folder" / "clip.mp4").read_bytes() == (tmp_path / "built" / "clip.mp4").read_bytes()


def test_an_incomplete_folder_names_every_missing_part(saved, tmp_path, no_model_load):
    broken = tmp_path / "broken"
    shutil.copytree(saved, broken)
    shutil.rmtree(broken / "vae")
    (broken / "tokenizer_2" / "tokenizer_config.json").unlink()
    for weights in (broken / "text_encoder").glob("*.safetensors"):
        weights.unlink()
    config = broken / "transformer" / "config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "_class_name": "FluxTransformer2DModel"}))
    with pytest.raises(InputError) as err:
        sagevideo.generate(["a cat"], model=str(broken), out=tmp_path / "out", device="cpu", progress=False)
    assert str(err.value) == (
        f"--model {broken}: not a complete Open-Sora 2.0 folder: transformer/config.json names "
        "'FluxTransformer2DModel', not OpenSoraTransformer3DModel (the Open-Sora 2.0 MMDiT); vae/ (the HunyuanVideo "
        "VAE) is missing; text_encoder/ has no .safetensors weights (sagevideo loads safetensors only); "
        "tokenizer_2/tokenizer_config.json is missing (the CLIP tokenizer); write one with `sagevideo "
        "convert-opensora OFFICIAL_DIR FOLDER` (see docs/opensora.md)"
    )


def test_an_official_download_is_refused_with_the_conversion_command(tmp_path, no_model_load):
    (tmp_path / "Open_Sora_v2.safetensors").write_bytes(b"")
    with pytest.raises(InputError) as err:
        sagevideo.generate(["a cat"], model=str(tmp_path), out=tmp_path / "out", device="cpu", progress=False)
    assert str(err.value) == (
        f"--model {tmp_path}: {tmp_path} is the official Open-Sora 2.0 download (Open_Sora_v2.safetensors); "
        f"convert it once with `sagevideo convert-opensora {tmp_path} FOLDER` and give --model FOLDER"
    )
