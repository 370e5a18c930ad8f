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


def test_a_recipe_runs_or_is_refused_naming_the_option():
    runner = CliRunner()
    result = runner.invoke(app, ["profile", "--model", "tiny-wan", "--recipe", "eager-sage"])
    assert result.exit_code == 0, result.output
    assert "recipe eager-sage" in result.output and "largest kernels" not in result.output  # no kernels on the CPU
    result = runner.invoke(app, ["profile", "--recipe", "compile-sage", "--device", "cpu"])
    assert result.exit_code == 2 and "--recipe compile-sage: on the CPU" in result.stderr
    result = runner.invoke(app, ["profile", "--recipe", "fast"])
    assert result.exit_code == 2 and "--recipe:" in result.stderr and "is not [fp8-](eager|compile)" in result.stderr


def test_an_unwritable_json_or_plot_exits_2_before_building(tmp_path, monkeypatch):
    from sagevideo.pipelines import forwards

    def refuse(name, device="cpu", *args, **kwargs):
        if str(device) != "meta":
            raise AssertionError("built a model for a run that cannot write its report")
        return real(name, device, *args, **kwargs)

    real = forwards.build_step
    monkeypatch.setattr(forwards, "build_step", refuse)
    for option, name in (("--json", "p.json"), ("--plot", "p.png")):
        path = tmp_path / "missing" / name
        result = CliRunner().invoke(app, ["profile", "--model", "tiny-wan", option, str(path)])
        assert result.exit_code == 2, result.output
        assert result.stderr.strip() == (f"sagevideo profile: error: {option} {path}: folder {path.parent} does not "
                                         "exist; create it first or give another path")
