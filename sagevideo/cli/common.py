"""What every command shares: error lines, the one mapping of exceptions to exit codes, and the
typer options made from a config model's fields (one declaration of each option).

Heavy modules (torch, diffusers, triton, ray) are imported inside the commands only, so
`sagevideo --help` stays instant; this module imports typer, sagevideo.errors and
`sagevideo.jobs.config` (pydantic).
"""

from __future__ import annotations

import contextlib
import enum
import errno
import functools
import inspect
import os
import re
import sys
import typing
from collections.abc import Callable, Iterator, Mapping
from typing import Annotated, Any, Literal

import annotated_types
import typer
from typer.core import TyperCommand

from sagevideo.errors import EXIT_BAD_INPUT, EXIT_FAILED, InputError, exit_code_for
from sagevideo.jobs.config import option_panel, option_type, options_in_order

__all__ = ["EXIT_BAD_INPUT", "EXIT_FAILED", "InputError", "add_config_command", "echo_while_able", "fail",
           "handle_errors"]


def fail(command: str, message: str, code: int) -> typer.Exit:
    """Print 'sagevideo <command>: error: ...' to stderr (one line per line); return the Exit to raise."""
    lines = message.splitlines() or [""]
    for line in lines:
        typer.echo(f"sagevideo {command}: error: {line}", err=True)
    return typer.Exit(code)


def echo_while_able(line: str) -> None:
    """typer.echo for a line printed as a run stops. Where the terminal is gone (a SIGHUP stopped the
    run: writes fail with EIO), stdout and stderr are pointed at /dev/null instead, so the exit
    status stays the stop's: Python's flush of them at exit would fail again and exit 120."""
    try:
        typer.echo(line)
        sys.stdout.flush()
    except OSError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        for fd in (1, 2):
            os.dup2(devnull, fd)
        os.close(devnull)


@contextlib.contextmanager
def handle_errors(command: str, on_interrupt: Callable[[BaseException], None] | None = None) -> Iterator[None]:
    """Exit with `sagevideo.errors.exit_code_for(err)` for every user-facing exception: its message as
    error lines (or, for an interrupt, `on_interrupt(err)`), no traceback; the machine's own errors
    too (an OSError as `FILE: reason (ENOSPC)`, memory). Other exceptions are bugs and show as such."""
    try:
        yield
    except (typer.Exit, typer.Abort):
        raise
    except BaseException as err:
        code = exit_code_for(err)
        if code is None:
            raise
        if isinstance(err, KeyboardInterrupt):
            if on_interrupt is not None:
                on_interrupt(err)
            raise typer.Exit(code) from None
        raise fail(command, user_message(err), code) from None


def user_message(err: BaseException) -> str:
    """What to print for a user-facing exception: an OSError as 'FILE: reason (ENOSPC)', a bare
    MemoryError as 'out of memory', else its message."""
    if isinstance(err, OSError) and err.strerror:
        where = f"{err.filename}: " if err.filename else ""
        name = errno.errorcode.get(err.errno or 0)
        return f"{where}{err.strerror}" + (f" ({name})" if name else "")
    if isinstance(err, MemoryError) and not str(err):
        return "out of memory; free memory or run a smaller job"
    return str(err) or type(err).__name__


# --- options from a config model ---------------------------------------------------------------


def _strip(annotation: Any) -> Any:
    """The type typer should parse for a field's annotation (`option_type`), a list of choices as a
    list of an Enum's members."""
    annotation = option_type(annotation)
    if typing.get_origin(annotation) is list:  # typer reads list[Enum] but not list[Literal]
        (item,) = typing.get_args(annotation)
        if typing.get_origin(item) is Literal:
            return list[_choices_enum(typing.get_args(item))]
    return annotation


@functools.cache
def _choices_enum(values: tuple[str, ...]) -> type[enum.Enum]:
    return enum.Enum("Choice", {v: v for v in values}, type=str)


def _plain(value: Any) -> Any:
    """Enum members (of `_choices_enum`) back to their strings, in lists too."""
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def plain_help(text: str | None) -> str | None:
    """`text` as typer's rich help shows it literally: square brackets (`[fp8-]`) escaped, where
    rich would take them for markup and drop them."""
    from rich.markup import escape

    return None if text is None else escape(text)


def config_parameters(config: type, cli: Mapping[str, Mapping[str, Any]], skip: tuple[str, ...] = ()) -> list:
    """One typer parameter per field of the pydantic model `config`, but `skip`, in the order of
    `sagevideo.jobs.config.options_in_order` (its own fields, then those of the shared groups it
    inherits, a group with a `cli_panel` in that help panel).

    The field's description is the help (always: one declaration) and its default the default;
    `cli[field]` may give "flags" (option names, e.g. ("--out", "-o") or
    ("--frames-png/--no-frames-png",)), "argument" (a positional argument), "type" (what typer
    parses, when not the field's type), "default" (the command line's own), "option" (more
    typer.Option keywords), and "range": True (typer checks the field's ge/le bounds itself and
    shows them in the help)."""
    params = []
    for name, field in options_in_order(config):
        if name in skip:
            continue
        spec = cli.get(name, {})
        kind = _strip(spec.get("type") or field.annotation)
        text = plain_help(field.description)
        if field.is_required():
            default: Any = ...
        else:
            default = spec["default"] if "default" in spec else field.get_default(call_default_factory=True)
        if spec.get("argument"):
            info: Any = typer.Argument(help=text, show_default=False)
        else:
            more = dict(spec.get("option", {}))
            if spec.get("range"):
                for bound in field.metadata:
                    if isinstance(bound, annotated_types.Ge):
                        more["min"] = bound.ge
                    elif isinstance(bound, annotated_types.Le):
                        more["max"] = bound.le
            panel = option_panel(config, name)
            if panel:
                more.setdefault("rich_help_panel", panel)
            info = typer.Option(*spec.get("flags", ()), help=text, **more)
        annotation = Annotated[kind | None if default is None else kind, info]
        params.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation))
    return params


_WHOLE_NUMBER = re.compile(r"[+-]?\d+")


def config_command(config: type, options: frozenset[str], api_only: tuple[str, ...] = ()) -> type[TyperCommand]:
    """The command class of a command made from `config`: it names its config and the fields left
    to the Python API (`config`, `api_only`, read by the tests that check every option is one
    field), and its `options` (the flags of `list[int]` fields) also take several values after one
    flag, negative ones included: `--linear-bf16-steps 0 -1` is read as `--linear-bf16-steps 0
    --linear-bf16-steps -1`. click gives an option one value per flag (it has no variable count for
    options) and takes a `-1` after the value for a flag of its own."""

    class ConfigCommand(TyperCommand):
        def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
            return super().parse_args(ctx, spread_values(args, options))

    ConfigCommand.config = config  # type: ignore[attr-defined]
    ConfigCommand.api_only = api_only  # type: ignore[attr-defined]
    return ConfigCommand


def whole_number_lists(config: type, cli: Mapping[str, Mapping[str, Any]] | None = None) -> frozenset[str]:
    """The flags of `config`'s `list[int]` fields (e.g. --linear-bf16-steps), for `config_command`."""
    cli = cli or {}
    flags: set[str] = set()
    for name, field in config.model_fields.items():
        spec = cli.get(name, {})
        kind = _strip(spec.get("type") or field.annotation)
        if typing.get_origin(kind) is list and typing.get_args(kind) == (int,):
            flags.update(spec.get("flags") or ("--" + name.replace("_", "-"),))
    return frozenset(flags)


def spread_values(args: list[str], options: set[str]) -> list[str]:
    """`args` with the whole numbers that follow the value of one of `options` given each its own
    flag (['--steps-x', '0', '-1'] -> ['--steps-x', '0', '--steps-x', '-1']); nothing after `--`."""
    spread: list[str] = []
    rest = list(args)
    while rest:
        arg = rest.pop(0)
        spread.append(arg)
        if arg == "--":
            return spread + rest
        name, has_value, _ = arg.partition("=")
        if name not in options:
            continue
        if not has_value and rest:  # the flag's own value, as click reads it
            spread.append(rest.pop(0))
        while rest and _WHOLE_NUMBER.fullmatch(rest[0]):
            spread += [name, rest.pop(0)]
    return spread


def add_config_command(
    app: typer.Typer,
    name: str,
    config: type,
    run: Callable[[dict[str, Any]], None],
    *,
    doc: str,
    cli: Mapping[str, Mapping[str, Any]] | None = None,
    skip: tuple[str, ...] = (),
) -> None:
    """Register command `name` whose options are `config`'s fields (see `config_parameters`);
    run(values) gets them by field name. doc: the command's help. A `list[int]` option takes several
    values after one flag (`config_command`)."""

    def command(**values: Any) -> None:
        run({name: _plain(value) for name, value in values.items()})

    command.__signature__ = inspect.Signature(config_parameters(config, cli or {}, skip))  # type: ignore[attr-defined]
    command.__doc__ = doc
    command.__name__ = command.__qualname__ = name.replace("-", "_")
    app.command(name, cls=config_command(config, whole_number_lists(config, cli), skip))(command)
