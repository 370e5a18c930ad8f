"""`sagevideo profile` on the command line."""

import json

from typer.testing import CliRunner

from sagevideo.cli.app import app


def test_profile_prints_the_table_and_writes_json(tmp_path):
    result = CliRunner().invoke(app, ["profile", "--model", "tiny-hunyuanvideo", "--json", str(tmp_path / "p.json")])
    assert result.exit_code == 0, result.output
    assert "attention" in result.output and "≤" in result.output
    data = json.loads((tmp_path / "p.json").read_text())
    assert abs(sum(data["shares"].values()) - 1) < 1e-9


def test_bad_sizes_exit_2_before_building():
    runner = CliRunner()
    assert runner.invoke(app, ["profile", "--resolution", "480by720"]).exit_code == 2
    result = runner.invoke(app, ["profile", "--frames", "50"])
    assert result.exit_code == 2 and "4k + 1" in result.output


def test_a_bad_model_config_is_one_line_naming_the_option():
    result = CliRunner().invoke(app, ["profile", "--model", "tiny"])
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines() == [
        "sagevideo profile: error: --model: unknown model config 'tiny'; use one of cogvideox-5b, hunyuanvideo, "
        "opensora-768px, tiny-cogvideox, tiny-hunyuanvideo, tiny-opensora, tiny-wan, wan-14b"
    ]
