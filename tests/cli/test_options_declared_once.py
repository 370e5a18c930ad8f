"""Every option is declared once: each command's options are its config's fields (walked through typer's
click command tree), with the field's description as help; no help text is declared twice."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import typer

from sagevideo.cli.app import app
from sagevideo.cli.common import plain_help

CLI_DIR = Path(__file__).resolve().parents[2] / "sagevideo" / "cli"


def commands(group, prefix: str = "") -> dict:
    """Every command of the tree, by its full name ('generate', 'bench forward')."""
    found = {}
    for name, command in group.commands.items():
        if hasattr(command, "commands"):  # a group (typer's own click)
            found.update(commands(command, f"{prefix}{name} "))
        else:
            found[prefix + name] = command
    return found


def options(command) -> list:
    return [p for p in command.params if p.name != "help"]


def test_every_option_is_one_field_of_its_commands_config_with_its_description():
    walked = commands(typer.main.get_command(app))
    assert {"generate", "ab", "eval", "check-weights", "calibrate", "simulate", "profile", "convert-opensora",
            "bench attention", "bench forward"} <= set(walked)
    for name, command in walked.items():
        config = getattr(command, "config", None)
        if config is None:  # a command without options (env)
            assert options(command) == [], name
            continue
        fields = config.model_fields
        params = {p.name: p for p in options(command)}
        assert len(params) == len(options(command)), name  # no field twice
        assert set(params) == set(fields) - set(command.api_only), name  # every option a field, every field an option
        for field_name, param in params.items():
            assert param.help == plain_help(fields[field_name].description), f"{name} {field_name}"


def _declared_descriptions() -> dict[str, list[str]]:
    """Each help text of the commands' configs -> the fields (Class.field where declared) that declare it."""
    seen: dict[tuple[type, str], str] = {}
    for command in commands(typer.main.get_command(app)).values():
        config = getattr(command, "config", None)
        for name, field in (config.model_fields.items() if config else ()):
            owner = next(base for base in config.__mro__ if name in inspect.get_annotations(base))
            seen[(owner, name)] = field.description
    by_text: dict[str, list[str]] = {}
    for (owner, name), text in seen.items():
        by_text.setdefault(text, []).append(f"{owner.__name__}.{name}")
    return by_text


def test_no_help_text_is_declared_by_two_fields():
    twice = {text: where for text, where in _declared_descriptions().items() if len(where) > 1}
    assert twice == {}


def test_the_cli_modules_declare_no_option_by_hand():
    """typer.Option / typer.Argument only in the generator (cli/common.py): a command's options come from a config."""
    by_hand = []
    for path in sorted(CLI_DIR.glob("*.py")):
        if path.name == "common.py":
            continue
        text = path.read_text(encoding="utf-8")
        by_hand += [f"{path.name}: {m.group(0)}" for m in re.finditer(r"typer\.(Option|Argument)\(", text)]
        by_hand += [f"{path.name}: add_argument" for _ in re.finditer(r"add_argument\(", text)]
    assert by_hand == []
