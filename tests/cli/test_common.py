"""The CLI's shared layer (`cli/common.py`): every command builds one config object, its options are the
config's fields (or checked against them); `handle_errors` prints messages and maps exit codes."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import typer

from sagevideo import errors
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
            if param.multiple:  # a repeatable option: typer's None or () for the config's None or []
                assert expected in (None, []) and not param.default, field_name
            else:
                assert param.default == expected, field_name


def test_handle_errors_prints_the_message_and_exits_with_its_code(capsys):
    from sagevideo.cli.common import handle_errors

    with pytest.raises(typer.Exit) as stop, handle_errors("generate"):
        raise errors.InputError("--steps 0: give more\njob 2: seed: no")
    assert stop.value.exit_code == 2
    assert capsys.readouterr().err.splitlines() == [
        "sagevideo generate: error: --steps 0: give more", "sagevideo generate: error: job 2: seed: no"
    ]
    seen = []
    with pytest.raises(typer.Exit) as stop, handle_errors("generate", on_interrupt=seen.append):
        raise errors.BatchInterrupted(SimpleNamespace(signal="SIGTERM"))
    assert stop.value.exit_code == 143 and len(seen) == 1
    with pytest.raises(ZeroDivisionError), handle_errors("generate"):  # a bug shows as one
        raise ZeroDivisionError("a bug")


def test_the_machines_own_errors_are_one_line_without_a_traceback(capsys):
    """A full disk, a permission or memory met outside the places that handle them: one line, exit 1."""
    import errno
    import os

    from sagevideo.cli.common import handle_errors

    for err, line in [
        (OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "/out/report.html"),
         "sagevideo eval: error: /out/report.html: No space left on device (ENOSPC)"),
        (PermissionError(errno.EACCES, os.strerror(errno.EACCES), "/out"), "sagevideo eval: error: /out: Permission "
         "denied (EACCES)"),
        (MemoryError(), "sagevideo eval: error: out of memory; free memory or run a smaller job"),
    ]:
        with pytest.raises(typer.Exit) as stop, handle_errors("eval"):
            raise err
        assert stop.value.exit_code == 1
        assert capsys.readouterr().err.splitlines() == [line]


@pytest.mark.parametrize("argv", [["profile", "--help"], ["bench", "forward", "--help"]])
def test_help_shows_square_brackets_literally(argv, monkeypatch):
    """Rich takes `[fp8-]` for markup and drops it: the recipe-name form must reach the help whole."""
    from typer.testing import CliRunner

    from sagevideo.cli.common import plain_help

    assert plain_help("[fp8-](eager|compile)") == "\\[fp8-](eager|compile)" and plain_help(None) is None
    monkeypatch.setenv("COLUMNS", "240")
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 0 and "[fp8-](eager|compile)-(cudnn|sdpa|sage)" in result.output


@pytest.mark.parametrize("args, steps", [
    (["--linear-bf16-steps", "0", "-1"], [0, -1]),  # as the README writes it
    (["--linear-bf16-steps=0", "-1", "2"], [0, -1, 2]),
    (["--linear-bf16-steps", "-1", "--linear-bf16-steps", "0"], [-1, 0]),  # repeated, as before
    (["--linear-bf16-steps", "0", "-1", "JOB.yaml"], [0, -1]),  # the job file after the values stays the job file
])
@pytest.mark.parametrize("command", ["generate", "ab", "calibrate"])
def test_a_whole_number_list_option_takes_several_values_negative_ones_included(
    tmp_path, monkeypatch, command, args, steps
):
    from typer.testing import CliRunner

    seen = {}

    def stop(config, /, **_):  # each command's work, given the config its options built
        seen["steps"] = list(config.linear_bf16_steps)
        raise errors.InputError("stopped here")

    for target in ("sagevideo.generation.generate.plan_batch", "sagevideo.experiments.ab.ab",
                   "sagevideo.experiments.calibrate.calibrate"):
        monkeypatch.setattr(target, stop)
    job = tmp_path / "JOB.yaml"
    args = [str(job) if a == "JOB.yaml" else a for a in args]
    given = [] if str(job) in args or command == "calibrate" else [str(job)]
    result = CliRunner().invoke(app, [command, *given, "--out", str(tmp_path / "out"), *args])
    assert result.exit_code == 2 and "error: stopped here" in result.stderr, result.output
    assert seen["steps"] == steps


def test_spread_values_gives_each_value_its_flag_and_leaves_the_rest():
    from sagevideo.cli.common import spread_values

    flag = {"--steps-x"}
    assert spread_values(["--steps-x", "0", "-1", "--seed", "-3", "a.yaml"], flag) == [
        "--steps-x", "0", "--steps-x", "-1", "--seed", "-3", "a.yaml"]
    assert spread_values(["--", "--steps-x", "0", "1"], flag) == ["--", "--steps-x", "0", "1"]
    assert spread_values(["--steps-x"], flag) == ["--steps-x"]  # click says the value is missing
