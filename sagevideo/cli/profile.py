"""`sagevideo profile`: one denoising step under torch.profiler; its options are `ProfileConfig`'s
fields (one declaration each)."""

from __future__ import annotations

from typing import Any

import typer

from sagevideo.cli.common import add_config_command, handle_errors
from sagevideo.experiments.profile import ProfileConfig

CLI: dict[str, dict[str, Any]] = {
    "json_out": {"flags": ("--json",)},
    "max_hours": {"range": True},
}
API_ONLY = ("dtype",)

DOC = """Share of one denoising step in attention, linears and the rest, with each lever's Amdahl bound.

    Exit codes: 0 done, 2 bad input, or a run that cannot fit in memory or would take longer than
    --max-hours here (checked before building the model)."""


def run(values: dict[str, Any]) -> None:
    from sagevideo.experiments.profile import run_profile

    with handle_errors("profile"):
        config = ProfileConfig.build(**values)
        report = run_profile(config)
    typer.echo(report.table())
    shares = ", ".join(f"{part} {share:.0%}" for part, share in report.shares.items())
    written = [str(path) for path in (config.json_out, config.plot) if path is not None]
    where = f" -> {', '.join(written)}" if written else ""
    typer.echo(f"sagevideo profile: {config.model}: {shares} of a step{where}")


def register(app: typer.Typer) -> None:
    add_config_command(app, "profile", ProfileConfig, run, doc=DOC, cli=CLI, skip=API_ONLY)
