"""Broken model folders refused before loading (`pipelines/folder_check.py`, through `resolve_model`):
truncated or corrupted safetensors, a shard index that does not fit its shards, config values of
the wrong type, symlink loops; one line per problem, exit 2, no model loaded."""

from __future__ import annotations

import json
import os
import shutil

import pytest
from typer.testing import CliRunner

from sagevideo.cli.app import app
from sagevideo.errors import InputError
from sagevideo.pipelines.loading import resolve_model

WEIGHTS = "transformer/diffusion_pytorch_model.safetensors"


@pytest.fixture(scope="session")
def saved_tiny(tiny_pipe, tmp_path_factory):
    """The tiny CogVideoX saved once as a diffusers folder, and once with its transformer in shards."""
    root = tmp_path_factory.mktemp("saved")
    tiny_pipe.save_pretrained(root / "whole", safe_serialization=True)
    tiny_pipe.transformer.save_pretrained(root / "sharded", safe_serialization=True, max_shard_size="200KB")
    return root


@pytest.fixture
def folder(saved_tiny, tmp_path):
    """A copy of the saved tiny model to break."""
    return shutil.copytree(saved_tiny / "whole", tmp_path / "model")


@pytest.fixture
def sharded(saved_tiny, folder):
    """The copy with its transformer in shards (diffusion_pytorch_model-0000N-of-0000M.safetensors + index)."""
    shutil.rmtree(folder / "transformer")
    shutil.copytree(saved_tiny / "sharded", folder / "transformer")
    return folder


def refused(folder) -> list[str]:
    with pytest.raises(InputError) as err:
        resolve_model(str(folder))
    lines = str(err.value).splitlines()
    assert all(line.startswith(f"--model {folder}: ") for line in lines)
    return [line.removeprefix(f"--model {folder}: ") for line in lines]


def edit_json(path, **changes):
    data = json.loads(path.read_text())
    path.write_text(json.dumps({**data, **changes}))


def test_a_saved_model_has_no_problems(folder, sharded):
    assert resolve_model(str(sharded)).heads == 2


def test_a_truncated_safetensors_file(folder):
    weights = folder / WEIGHTS
    weights.write_bytes(weights.read_bytes()[:-100])  # an interrupted copy
    (line,) = refused(folder)
    assert line.startswith(f"{WEIGHTS}: truncated or incomplete (") and "not what its header lists" in line
    assert line.endswith("copy or download it again")


@pytest.mark.parametrize("at, says", [(3, "header too large"), (20, "invalid JSON in header")])
def test_flipped_header_bytes(folder, at, says):
    """A flipped byte in the header's length or in its JSON; one in a tensor's payload (not header) is
    seen by nothing short of a checksum."""
    weights = folder / WEIGHTS
    data = bytearray(weights.read_bytes())
    data[at] ^= 0x5A
    weights.write_bytes(bytes(data))
    (line,) = refused(folder)
    assert line.startswith(f"{WEIGHTS}: not a readable safetensors file (") and says in line


def test_a_shard_index_naming_a_missing_shard_or_tensors_its_shard_lacks(sharded):
    index_path = sharded / "transformer" / "diffusion_pytorch_model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    shards = sorted(set(index["weight_map"].values()))
    os.remove(sharded / "transformer" / shards[0])
    tensor = next(t for t, f in index["weight_map"].items() if f == shards[1])
    index["weight_map"][tensor + "_renamed"] = index["weight_map"].pop(tensor)
    index_path.write_text(json.dumps(index))
    count = sum(f == shards[0] for f in index["weight_map"].values())
    place = "transformer/diffusion_pytorch_model.safetensors.index.json"
    assert sorted(refused(sharded)) == sorted([
        f"{place}: names {shards[0]} ({count} tensor{'s' if count > 1 else ''}), which is missing; copy the "
        "missing shard",
        f"{place}: maps 1 tensor to {shards[1]}, which does not hold them (e.g. '{tensor}_renamed'); the index "
        "and the shards are of different copies: copy them again",
    ])


def test_config_values_of_the_wrong_type_one_line_each(folder):
    edit_json(folder / "transformer" / "config.json", num_layers="two", norm_eps=[1])
    edit_json(folder / "text_encoder" / "config.json", d_model="wide")
    edit_json(folder / "vae" / "config.json", block_out_channels=[32, "x"])
    (folder / "scheduler" / "scheduler_config.json").write_text("{not json")
    lines = refused(folder)
    assert len(lines) == 5, lines
    assert ('transformer/config.json: num_layers is "two", but CogVideoXTransformer3DModel takes int there, '
            "default 30; correct the value, or copy or download it again") in lines
    assert any(line.startswith("transformer/config.json: norm_eps is [1], but CogVideoXTransformer3DModel takes "
                               "float") for line in lines)
    assert any(line.startswith('text_encoder/config.json: d_model is "wide", but T5EncoderModel takes int')
               for line in lines)
    assert any(line.startswith('vae/config.json: block_out_channels is [32, "x"], but AutoencoderKLCogVideoX takes')
               for line in lines)
    assert any(line.startswith("scheduler/scheduler_config.json: not readable JSON (") for line in lines)


def test_null_where_the_default_is_none_and_numbers_as_the_libraries_take_them(folder):
    edit_json(folder / "transformer" / "config.json", patch_size_t=None, dropout=0, num_layers=1)
    edit_json(folder / "vae" / "config.json", force_upcast=True)  # diffusers annotates it float
    assert resolve_model(str(folder)).layers == 1
    edit_json(folder / "transformer" / "config.json", num_layers=1.0)  # range(1.0) would fail in the loader
    (line,) = refused(folder)
    assert line.startswith("transformer/config.json: num_layers is 1.0, but CogVideoXTransformer3DModel takes int")


def test_symlink_loops_and_links_to_nothing(folder, tmp_path):
    os.remove(folder / WEIGHTS)
    os.symlink("diffusion_pytorch_model.safetensors", folder / WEIGHTS)  # itself
    shutil.rmtree(folder / "scheduler")
    os.symlink("scheduler", folder / "scheduler")
    os.symlink(tmp_path / "gone.json", folder / "tokenizer" / "added_tokens.json")
    assert sorted(refused(folder)) == [
        "scheduler: a symlink loop (scheduler -> scheduler); point it at the real file, or copy the file in its place",
        f"tokenizer/added_tokens.json: a symlink to {tmp_path / 'gone.json'}, which does not exist (an incomplete "
        "download or copy?); copy or download it again",
        f"{WEIGHTS}: a symlink loop (diffusion_pytorch_model.safetensors -> diffusion_pytorch_model.safetensors); "
        "point it at the real file, or copy the file in its place",
    ]
    looped = tmp_path / "looped"
    os.symlink(looped, looped)
    with pytest.raises(InputError, match=r"--model .*looped: a symlink loop \("):
        resolve_model(str(looped))


def test_generate_refuses_a_broken_folder_with_exit_2_before_loading(folder, tmp_path, no_model_load):
    weights = folder / WEIGHTS
    weights.write_bytes(weights.read_bytes()[:1000])
    edit_json(folder / "transformer" / "config.json", num_layers="two")
    result = CliRunner().invoke(app, ["generate", "-p", "a fox", "--model", str(folder), "--out", str(tmp_path / "o"),
                                      "--no-progress"])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert "Traceback" not in result.output and len(lines) == 2, result.output
    assert all(line.startswith(f"sagevideo generate: error: --model {folder}: transformer/") for line in lines)


@pytest.mark.parametrize("model", ["tiny-wan22", "tiny-wan-i2v", "tiny-hunyuanvideo", "tiny-opensora",
                                   "tiny-cogvideox-i2v"])
def test_every_familys_saved_folder_passes(model, tmp_path):
    """No false refusal: each family's classes (diffusers, transformers, sagevideo's Open-Sora) take
    the configs save_pretrained writes."""
    import torch

    from sagevideo.pipelines import families

    family = families.for_tiny(model)
    pipe = family.load(family.tiny_source(model), "cpu", torch.float32)
    pipe.save_pretrained(tmp_path / "model", safe_serialization=True)
    assert resolve_model(str(tmp_path / "model")).path == (tmp_path / "model").resolve()
