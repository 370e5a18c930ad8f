"""`sagevideo env`: versions, devices, and which kernel plan runs where (`sagevideo.experiments.environment`)."""

from __future__ import annotations

import typer

from sagevideo.cli.common import handle_errors


def env() -> None:
    """Print torch/triton/GPU versions and which kernel plan runs on each device, and why."""
    from sagevideo.errors import InputError
    from sagevideo.experiments.environment import report_lines

    with handle_errors("env"):
        try:
            lines = report_lines()
        except ValueError as err:  # a misspelt SAGEVIDEO_SM90_KERNEL
            raise InputError(str(err)) from None
    for line in lines:
        typer.echo(line)


def register(app: typer.Typer) -> None:
    app.command()(env)
