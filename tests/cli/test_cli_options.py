"""Every command builds one config object: its options are the config's fields (or checked against them)."""

from __future__ import annotations

import pytest
import typer

from sagevideo.cli.app import app


def command_params(name):
    return {p.name: p for p in typer.main.get_command(app).commands[name].params}


@pytest.mark.parametrize(
    "command, config, api_only",
    [
        ("calibrate", "sagevideo.experiments.calibrate:CalibrateConfig", ("guidance",)),
        ("simulate", "sagevideo.eval.numerics.config:SimulateConfig", ()),
        ("ab", "sagevideo.experiments.ab:ABConfig", ()),
    ],
)
def test_options_match_the_config(command, config, api_only):
    import importlib

    module, name = config.split(":")
    model = getattr(importlib.import_module(module), name)
    params = command_params(command)
    cli_spelling = {"shape": "1,8,1024,128"}  # simulate reads B,H,N,D from a string
    for field_name, field in model.model_fields.items():
        if field_name in api_only:
            assert field_name not in params
            continue
        param = params[field_name]
        assert param.help == field.description, field_name
        if field.is_required():
            assert param.required, field_name
        else:
            expected = cli_spelling.get(field_name, field.default)
            if param.multiple:  # a repeatable option: typer's None or () for the config's None
                assert expected is None and not param.default, field_name
            else:
                assert param.default == expected, field_name


def test_bad_values_name_the_option_and_exit_2(tmp_path):
    from typer.testing import CliRunner

    result = CliRunner().invoke(app, ["simulate", "--shape", "1,2,3"])
    assert result.exit_code == 2
    assert "sagevideo simulate: error: --shape 1,2,3: give B,H,N,D as four positive integers" in result.stderr
