"""`sagevideo eval`, `sagevideo ab` and `sagevideo check-weights` (sagevideo.eval, sagevideo.experiments.ab).

Their options are configs' fields (one declaration each): eval's `EvalConfig`, ab's `ABConfig`
with the evaluation's `EvalSettings` (`ABCommandOptions`), check-weights' `WeightsOptions`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from sagevideo.cli.common import EXIT_FAILED, add_config_command, fail, handle_errors
from sagevideo.experiments.ab import ABConfig
from sagevideo.experiments.evaluation import EvalConfig, EvalSettings, WeightsOptions

_EVALUATION_CLI: dict[str, dict[str, Any]] = {
    "metrics": {"flags": ("--metrics", "-m")},
    "resamples": {"range": True},
    "set_resamples": {"range": True},
    "diff_gain": {"range": True},
}
EVAL_CLI: dict[str, dict[str, Any]] = {
    **_EVALUATION_CLI,
    "ref_dir": {"argument": True},
    "test_dir": {"argument": True},
    "out": {"flags": ("--out", "-o")},
}
AB_CLI: dict[str, dict[str, Any]] = {
    **_EVALUATION_CLI,
    "job_file": {"argument": True},
    "out": {"flags": ("--out", "-o")},
    "attention_probe": {"flags": ("--attention-probe",)},
    "noise_floor": {"flags": ("--noise-floor/--no-noise-floor",)},
    "arms": {"flags": ("--arm",)},
    "progress": {"flags": ("--progress/--no-progress",)},
}


class ABCommandOptions(ABConfig, EvalSettings):
    """`sagevideo ab`'s options: the run's (`ABConfig`) and its evaluation's (`EvalSettings`; the
    device is the run's and the evaluation's)."""


EVAL_DOC = """Compare two output folders (paired by prompt and seed): metrics.json and report.html in --out.

    Exit codes: 0 done, 1 a metric's weights are present but could not be loaded (the other metrics
    are still written) or a file could not be written (a full disk: the error names it; the rest
    is written), 2 bad input (folders that do not pair, unknown metric; nothing was loaded).
    """

AB_DOC = """A/B test: run JOB_FILE quantized and at full precision (twice: the noise floor), then evaluate.

    Same prompts, seeds and initial latents in every arm; metrics.json and report.html go to --out.
    Re-running resumes. Exit codes: 0 done, 1 a job or a model load failed, 2 bad input (checked
    before any arm runs) or arms whose videos do not pair (found when evaluating, after they ran),
    130 interrupted.
    """

CHECK_WEIGHTS_DOC = """List each evaluation metric's weight files: present, missing, and where to put them.

    Nothing is ever downloaded. Exit code 0 when every metric can run, 1 when some would be skipped,
    2 bad input.
    """


def _settings(values: dict[str, Any], config: type) -> dict[str, Any]:
    """The values that are fields of `config`."""
    return {name: value for name, value in values.items() if name in config.model_fields}


def _print_verdicts(result: dict, out: Path) -> None:
    for line in result["verdicts"]:
        typer.echo(line)
    typer.echo(f"sagevideo: wrote {out / 'metrics.json'} and {out / 'report.html'}")


def _fail_for_lost_metrics(command: str, result: dict) -> None:
    """Exit 1 (after everything was written) when a metric's weights are present but broken."""
    if result.get("failed"):
        lost = ", ".join(result["failed"])
        message = f"{lost}: weights present but not loadable (see above); the other metrics are in metrics.json"
        raise fail(command, message, EXIT_FAILED)


def run_eval(values: dict[str, Any]) -> None:
    from sagevideo.errors import OutputsNotWritten
    from sagevideo.eval.evaluate import evaluate

    with handle_errors("eval"):
        config = EvalConfig.build(**values)
        try:
            result = evaluate(
                config.ref_dir, config.test_dir, out=config.out, noise_ref=config.noise_ref, options=config.options(),
                echo=lambda line: typer.echo(line, err=True),
                progress=lambda text: typer.echo(f"sagevideo eval: {text}", err=True),
            )
        except OutputsNotWritten as err:  # the verdicts were computed: show them before the error line
            for line in err.result["verdicts"]:
                typer.echo(line)
            raise
    _print_verdicts(result, config.out)
    _fail_for_lost_metrics("eval", result)


def run_ab(values: dict[str, Any]) -> None:
    from sagevideo.experiments.ab import ab

    def interrupted(stop: BaseException) -> None:  # BatchInterrupted's exit code: Ctrl-C 130, SIGTERM 143, SIGHUP 129
        typer.echo("sagevideo ab: interrupted; re-run the same command to resume", err=True)

    with handle_errors("ab", on_interrupt=interrupted):
        config = ABConfig.build(**_settings(values, ABConfig))
        options = EvalSettings.build(**_settings(values, EvalSettings)).options()
        result = ab(config, options=options, echo=lambda line: typer.echo(line, err=True))
    _print_verdicts(result, config.out)
    _fail_for_lost_metrics("ab", result)


def run_check_weights(values: dict[str, Any]) -> None:
    from sagevideo.errors import InputError
    from sagevideo.eval.weights import report_lines

    with handle_errors("check-weights"):
        config = WeightsOptions(**values)
        weights = config.weights
        if weights is not None and weights.exists() and not weights.is_dir():
            raise InputError(f"--weights {weights}: is a file; give the folder that holds the weights")
        lines, complete = report_lines(weights, lpips_net=config.lpips_net)  # an unreadable folder: one line
    for line in lines:
        typer.echo(line)
    if not complete:
        raise typer.Exit(EXIT_FAILED)


def register(app: typer.Typer) -> None:
    add_config_command(app, "eval", EvalConfig, run_eval, doc=EVAL_DOC, cli=EVAL_CLI)
    add_config_command(app, "ab", ABCommandOptions, run_ab, doc=AB_DOC, cli=AB_CLI)
    add_config_command(app, "check-weights", WeightsOptions, run_check_weights, doc=CHECK_WEIGHTS_DOC)
