"""`sagevideo generate`: its options are `GenerateConfig`'s fields (one declaration each)."""

from __future__ import annotations

import sys
from typing import Any

import typer

from sagevideo.cli.common import add_config_command, echo_while_able, handle_errors
from sagevideo.errors import EXIT_FAILED
from sagevideo.jobs.config import API_ONLY, COMMAND_LINE, GenerateConfig

DOC = """Generate videos into --out; re-running resumes (finished jobs are skipped, failed ones redone).

    Job-file values win over these options: job > the file's defaults > option.

    A job file's recipe: section gives the recipe options left at their defaults (both set, differently: an error).

    Exit codes: 0 all done, 1 a job or the model load failed (or a full disk stopped the batch), 2 bad input
    or --out in use by another run (nothing loaded), 130 Ctrl-C, 143 SIGTERM, 129 SIGHUP (finished videos kept).
    """


def run(values: dict[str, Any]) -> None:
    from tqdm.auto import tqdm

    from sagevideo.generation.generate import plan_batch, run_batch

    values["prompts_or_jobs"] = values["prompts_or_jobs"] or None  # no --prompt: the job file's, or the built-in
    with handle_errors("generate", on_interrupt=_summary):
        config = GenerateConfig.build(**values)
        batch = plan_batch(config)
        for note in batch.notes:
            typer.echo(f"sagevideo: {note}", err=True)
        report = run_batch(batch, progress=config.progress, echo=lambda line: tqdm.write(line, file=sys.stderr))
    typer.echo(report.summary_line())
    if not report.ok:
        raise typer.Exit(EXIT_FAILED)


def _summary(stop: BaseException) -> None:
    """A batch Ctrl-C, SIGTERM or SIGHUP stopped (`BatchInterrupted`): what finished, and the resume hint."""
    report = getattr(stop, "report", None)
    if report is not None:
        echo_while_able(report.summary_line())


def register(app: typer.Typer) -> None:
    add_config_command(app, "generate", GenerateConfig, run, doc=DOC, cli=COMMAND_LINE, skip=API_ONLY)
