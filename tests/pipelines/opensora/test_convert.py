"""Official checkpoint names -> the port: a synthetic checkpoint built from OPENSORA.md §2's table."""

import math

import pytest
import torch
from safetensors.torch import save_file

from sagevideo.pipelines.opensora import OpenSoraTransformer3DModel, convert_official_state_dict
from sagevideo.pipelines.opensora.convert import CheckpointMismatchError, load_official_checkpoint, official_key_shapes
from tests.helpers.opensora import TINY, official_key_table, official_tiny_checkpoint, reference_forward, tiny_inputs


def test_key_schema_matches_the_table():
    """The converter's expected keys and shapes equal the table written in the test from OPENSORA.md."""
    assert official_key_shapes(TINY) == official_key_table(TINY)
    released = official_key_shapes()
    assert len(released) == 1082  # OPENSORA.md §1: 11.891 B in 1082 tensors
    assert sum(math.prod(s) for s in released.values()) == 11_891_390_528
    assert released == official_key_table(dict(
        in_channels=64, vec_in_dim=768, context_in_dim=4096, hidden_size=3072, num_heads=24, depth=19,
        depth_single_blocks=38, mlp_ratio=4.0, cond_in_channels=68))


def test_clean_conversion_covers_every_parameter():
    model = OpenSoraTransformer3DModel(**TINY)
    sd = official_tiny_checkpoint()
    converted, report = convert_official_state_dict(sd, model.config)
    assert report.ok and report.missing == report.unexpected == report.mismatched == ()
    assert set(converted) == set(model.state_dict())
    # v_mlp rows 0:C are v, C: are the MLP input
    v_mlp = sd["single_blocks.0.v_mlp.weight"]
    assert torch.equal(converted["single_transformer_blocks.0.attn.to_v.weight"], v_mlp[:64])
    assert torch.equal(converted["single_transformer_blocks.0.proj_mlp.bias"], sd["single_blocks.0.v_mlp.bias"][64:])
    assert torch.equal(converted["transformer_blocks.0.attn.norm_added_k.weight"],
                       sd["double_blocks.0.txt_attn.norm.key_norm.scale"])


def test_broken_checkpoint_reports_keys_by_name():
    sd = official_tiny_checkpoint()
    del sd["double_blocks.0.img_attn.norm.query_norm.scale"]
    sd["single_blocks.0.linear_2.weight"] = sd.pop("single_blocks.0.linear2.weight")  # renamed
    sd["guidance_in.in_layer.weight"] = torch.zeros(64, 256)  # FLUX.1-dev only
    sd["double_blocks.1.img_mod.lin.bias"] = torch.zeros(384)  # a block the config does not have
    sd["txt_in.weight"] = torch.zeros(64, 4096)  # a config with another T5
    _, report = convert_official_state_dict(sd, TINY)
    assert report.missing == ("double_blocks.0.img_attn.norm.query_norm.scale", "single_blocks.0.linear2.weight")
    assert report.unexpected == (
        "double_blocks.1.img_mod.lin.bias", "guidance_in.in_layer.weight", "single_blocks.0.linear_2.weight")
    assert report.mismatched == ("txt_in.weight: expected (64, 32), got (64, 4096)",)
    assert not report.ok
    text = report.describe()
    for name in (*report.missing, *report.unexpected, "txt_in.weight"):
        assert name in text


def test_load_official_safetensors_file(tmp_path):
    sd = official_tiny_checkpoint()
    path = tmp_path / "Open_Sora_v2.safetensors"
    save_file(sd, str(path))
    model = OpenSoraTransformer3DModel(**TINY).eval()
    report = load_official_checkpoint(model, path)
    assert report.ok
    inputs = tiny_inputs()
    with torch.no_grad():
        torch.testing.assert_close(model(**inputs), reference_forward(sd, TINY, **inputs), atol=2e-5, rtol=2e-5)


def test_load_refuses_mismatch_and_leaves_model_untouched(tmp_path):
    sd = official_tiny_checkpoint()
    del sd["final_layer.linear.bias"]
    sd["extra.weight"] = torch.zeros(1)
    path = tmp_path / "broken.safetensors"
    save_file(sd, str(path))
    model = OpenSoraTransformer3DModel(**TINY)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(CheckpointMismatchError) as err:
        load_official_checkpoint(model, path)
    assert "final_layer.linear.bias" in str(err.value) and "extra.weight" in str(err.value)
    assert err.value.report.missing == ("final_layer.linear.bias",)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_load_paths(tmp_path):
    model = OpenSoraTransformer3DModel(**TINY)
    with pytest.raises(FileNotFoundError):
        load_official_checkpoint(model, tmp_path / "nope.safetensors")
    pickle = tmp_path / "model.pt"
    torch.save({}, pickle)
    with pytest.raises(ValueError, match="safetensors"):
        load_official_checkpoint(model, pickle)
    # a folder of shards
    sd = official_tiny_checkpoint()
    names = sorted(sd)
    shards = tmp_path / "shards"
    shards.mkdir()
    save_file({k: sd[k] for k in names[::2]}, str(shards / "a.safetensors"))
    save_file({k: sd[k] for k in names[1::2]}, str(shards / "b.safetensors"))
    assert load_official_checkpoint(model, shards).ok


def test_load_into_a_meta_model_and_save(tmp_path):
    """The released size is built on the meta device; loading assigns the checkpoint tensors, which
    must own their storage for save_pretrained (the v_mlp halves are cloned)."""
    sd = {k: v.to(torch.bfloat16) for k, v in official_tiny_checkpoint().items()}
    path = tmp_path / "ckpt.safetensors"
    save_file(sd, str(path))
    with torch.device("meta"):
        model = OpenSoraTransformer3DModel(**TINY)
    assert load_official_checkpoint(model, path).ok
    assert not any(p.is_meta for p in model.parameters()) and model.dtype == torch.bfloat16
    model.eval().save_pretrained(tmp_path / "folder")
    loaded = OpenSoraTransformer3DModel.from_pretrained(tmp_path / "folder").eval()  # fp32 by default
    torch.nn.Module.to(loaded, torch.bfloat16)  # exact: bf16 -> fp32 -> bf16
    inputs = {k: v.to(torch.bfloat16) for k, v in tiny_inputs().items()}
    with torch.no_grad():
        assert torch.equal(loaded(**inputs), model(**inputs))
