"""`sagevideo convert-opensora SRC DST` on the command line: a converted folder that --model loads,
and bad input (missing parts, a checkpoint of another config, DST not empty) refused with exit 2."""

from __future__ import annotations

import functools
import json

import pytest
from typer.testing import CliRunner

from sagevideo.cli.app import app
from tests.helpers.opensora import write_official_download


@pytest.fixture(scope="module")
def download(tmp_path_factory):
    root = tmp_path_factory.mktemp("official")
    write_official_download(root)
    return root


def test_convert_writes_a_folder_generate_loads(download, tmp_path, monkeypatch):
    """The tiny stand-in needs the tiny configs (the command converts the released architecture)."""
    from sagevideo.pipelines.opensora import official, tiny

    real = official.convert_official_folder
    monkeypatch.setattr(official, "convert_official_folder", functools.partial(
        real, transformer_config=tiny.TRANSFORMER_CONFIG, vae_config=tiny.VAE_CONFIG))
    out = tmp_path / "opensora"
    result = CliRunner().invoke(app, ["convert-opensora", str(download), str(out), "--dtype", "float32"])
    assert result.exit_code == 0, result.output
    assert result.stdout == f"sagevideo convert-opensora: wrote {out}; use it with --model {out}\n"
    assert f"sagevideo convert-opensora: transformer: {download / 'Open_Sora_v2.safetensors'}" in result.stderr
    assert json.loads((out / "model_index.json").read_text())["_class_name"] == "OpenSoraPipeline"
    from sagevideo.pipelines.loading import resolve_model

    assert resolve_model(str(out)).family == "opensora"


def test_missing_parts_are_exit_2_naming_each(tmp_path):
    result = CliRunner().invoke(app, ["convert-opensora", str(tmp_path), str(tmp_path / "out"),
                                      "--t5", str(tmp_path / "t5")])
    assert result.exit_code == 2, result.output
    error = "sagevideo convert-opensora: error: the official Open-Sora 2.0 parts are incomplete: "
    assert result.stderr.startswith(error)
    for part in (f"the MMDiT checkpoint: {tmp_path / 'Open_Sora_v2.safetensors'} is missing",
                 f"the T5-v1.1-XXL folder (transformers format): {tmp_path / 't5' / 'config.json'} is missing"):
        assert part in result.stderr
    assert not (tmp_path / "out").exists()


def test_a_checkpoint_of_another_config_or_a_full_destination_is_exit_2(download, tmp_path):
    result = CliRunner().invoke(app, ["convert-opensora", str(download), str(tmp_path / "out")])
    assert result.exit_code == 2, result.output
    assert "does not match the model config (official key names)" in result.stderr
    assert "is it the official Open_Sora_v2.safetensors?" in result.stderr
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    result = CliRunner().invoke(app, ["convert-opensora", str(download), str(tmp_path / "full"), "--dtype", "int4"])
    assert result.exit_code == 2 and "--dtype" in result.stderr and "int4" in result.stderr
    result = CliRunner().invoke(app, ["convert-opensora", str(download), str(tmp_path / "full")])
    assert result.exit_code == 2 and "exists and is not an empty folder" in result.stderr
