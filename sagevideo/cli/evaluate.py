"""`sagevideo eval`, `sagevideo ab` and `sagevideo check-weights` (sagevideo.eval, sagevideo.experiments.ab).

eval builds one `EvalOptions`; ab one `ABConfig` (its options, checked against the config's
fields by the tests) with the shared evaluation options."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal

import typer

from sagevideo.choices import Backend, Device, PVChoice
from sagevideo.cli.common import (
    EXIT_FAILED,
    config_parameters,
    fail,
    handle_errors,
    several_values,
    whole_number_lists,
)
from sagevideo.experiments.ab_arms import ARMS_HELP

LpipsNet = Literal["alex", "vgg"]

_MetricsOption = Annotated[
    list[str] | None,
    typer.Option("--metrics", "-m", help="Metrics to compute (repeatable or comma-separated): psnr, ssim, lpips, "
                 "clipsim, clip_t, fid, kid, or all (default). Metrics whose weights are missing are skipped."),
]
_WeightsOption = Annotated[
    Path | None,
    typer.Option("--weights", help="Folder of the metrics' weights (default $SAGEVIDEO_WEIGHTS or "
                 "~/.cache/sagevideo/weights; see `sagevideo check-weights`)."),
]
_LpipsOption = Annotated[LpipsNet, typer.Option(help="LPIPS backbone.")]
_ResamplesOption = Annotated[int, typer.Option(min=100, help="Bootstrap resamples over prompts (95% CI).")]
_SetResamplesOption = Annotated[
    int, typer.Option(min=10, help="Bootstrap resamples for FID/KID (each recomputes them from cached features).")
]
_GainOption = Annotated[float, typer.Option(min=1.0, help="Amplification of |test - reference| in difference videos.")]


def _eval_options(metrics, weights, device, lpips_net, resamples, set_resamples, diff_gain):
    """EvalOptions from the shared eval/ab options."""
    from sagevideo.choices import resolve_device
    from sagevideo.eval.evaluate import EvalOptions
    from sagevideo.eval.stats import Bootstrap

    return EvalOptions(
        metrics=metrics or None, weights=weights, device=resolve_device(device), lpips_net=lpips_net,
        bootstrap=Bootstrap(resamples=resamples, set_resamples=set_resamples), diff_gain=diff_gain,
    )


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


def eval_command(
    ref_dir: Annotated[Path, typer.Argument(help="Reference output folder (full precision), with manifest.jsonl.")],
    test_dir: Annotated[Path, typer.Argument(help="Test output folder (e.g. quantized), with manifest.jsonl.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Folder for metrics.json, report.html and figures.")] = ...,
    metrics: _MetricsOption = None,
    weights: _WeightsOption = None,
    noise_ref: Annotated[
        Path | None,
        typer.Option("--noise-ref", help="A second full-precision run with the same seeds: the noise floor."),
    ] = None,
    device: Annotated[Device, typer.Option(help="Where the metric networks run.")] = "auto",
    lpips_net: _LpipsOption = "alex",
    resamples: _ResamplesOption = 1000,
    set_resamples: _SetResamplesOption = 50,
    diff_gain: _GainOption = 8.0,
) -> None:
    """Compare two output folders (paired by prompt and seed): metrics.json and report.html in --out.

    Exit codes: 0 done, 1 a metric's weights are present but could not be loaded (the other metrics
    are still written) or a file could not be written (a full disk: the error names it; the rest
    is written), 2 bad input (folders that do not pair, unknown metric; nothing was loaded).
    """
    from sagevideo.errors import OutputsNotWritten
    from sagevideo.eval.evaluate import evaluate

    with handle_errors("eval"):
        options = _eval_options(metrics, weights, device, lpips_net, resamples, set_resamples, diff_gain)
        try:
            result = evaluate(
                ref_dir, test_dir, out=out, noise_ref=noise_ref, options=options,
                echo=lambda line: typer.echo(line, err=True),
                progress=lambda text: typer.echo(f"sagevideo eval: {text}", err=True),
            )
        except OutputsNotWritten as err:  # the verdicts were computed: show them before the error line
            for line in err.result["verdicts"]:
                typer.echo(line)
            raise
    _print_verdicts(result, out)
    _fail_for_lost_metrics("eval", result)


def ab_command(
    job_file: Annotated[
        Path, typer.Argument(help="Job file (YAML/TOML/text, as for `generate`) without attention, pv or plan.")
    ],
    out: Annotated[Path, typer.Option("--out", "-o", help="Folder for the three arms and the evaluation.")] = ...,
    model: Annotated[str, typer.Option(help="'tiny' (built in) or a local diffusers folder.")] = "tiny",
    plan: Annotated[Path | None, typer.Option(help="Attention-plan JSON for the quantized arm.")] = None,
    image: Annotated[
        Path | None,
        typer.Option(help="Input image (image-to-video models) for the jobs that name none; the same in every arm."),
    ] = None,
    pv: Annotated[
        PVChoice | None,
        typer.Option(
            help="P·V precision of the quantized arm (default: the plan's, else auto: FP8 on sm89+ GPUs, else FP16)."
        ),
    ] = None,
    backend: Annotated[Backend, typer.Option(help="sageattn backend of the quantized arm.")] = "auto",
    device: Annotated[Device, typer.Option(help="auto = CUDA when available, else CPU.")] = "auto",
    attention_probe: Annotated[
        bool, typer.Option("--attention-probe", help="Also measure each layer's attention error (cosine, rel-L1, "
                           "RMSE vs fp32) by re-running the quantized jobs with a probing router.")
    ] = False,
    noise_floor: Annotated[
        bool, typer.Option("--noise-floor/--no-noise-floor", help="Run full precision twice (the noise floor).")
    ] = True,
    metrics: _MetricsOption = None,
    weights: _WeightsOption = None,
    lpips_net: _LpipsOption = "alex",
    resamples: _ResamplesOption = 1000,
    set_resamples: _SetResamplesOption = 50,
    diff_gain: _GainOption = 8.0,
    arms: Annotated[list[str], typer.Option("--arm", help=ARMS_HELP)] = [],  # noqa: B006
    progress: Annotated[bool, typer.Option("--progress/--no-progress", help="Show progress bars.")] = True,
    **recipe: Any,
) -> None:
    """A/B test: run JOB_FILE quantized and at full precision (twice: the noise floor), then evaluate.

    Same prompts, seeds and initial latents in every arm; metrics.json and report.html go to --out.
    Re-running resumes. Exit codes: 0 done, 1 a job or a model load failed, 2 bad input (checked
    before any arm runs) or arms whose videos do not pair (found when evaluating, after they ran),
    130 interrupted.
    """
    from sagevideo.experiments.ab import ABConfig, ab

    def interrupted(stop: BaseException) -> None:  # BatchInterrupted's exit code: Ctrl-C 130, SIGTERM 143, SIGHUP 129
        typer.echo("sagevideo ab: interrupted; re-run the same command to resume", err=True)

    with handle_errors("ab", on_interrupt=interrupted):
        config = ABConfig.build(
            job_file, out=out, model=model, plan=plan, image=image, pv=pv, backend=backend, device=device,
            attention_probe=attention_probe, noise_floor=noise_floor, progress=progress, arms=arms, **recipe,
        )
        options = _eval_options(metrics, weights, device, lpips_net, resamples, set_resamples, diff_gain)
        result = ab(config, options=options, echo=lambda line: typer.echo(line, err=True))
    _print_verdicts(result, out)
    _fail_for_lost_metrics("ab", result)


def check_weights(
    weights: _WeightsOption = None,
    lpips_net: _LpipsOption = "alex",
) -> None:
    """List each evaluation metric's weight files: present, missing, and where to put them.

    Nothing is ever downloaded. Exit code 0 when every metric can run, 1 when some would be skipped,
    2 bad input.
    """
    from sagevideo.errors import InputError
    from sagevideo.eval.weights import report_lines

    with handle_errors("check-weights"):
        if weights is not None and weights.exists() and not weights.is_dir():
            raise InputError(f"--weights {weights}: is a file; give the folder that holds the weights")
        lines, complete = report_lines(weights, lpips_net=lpips_net)  # an unreadable folder: one line
    for line in lines:
        typer.echo(line)
    if not complete:
        raise typer.Exit(EXIT_FAILED)


def _with_recipe_options(command: Callable[..., None]) -> Callable[..., None]:
    """`command`'s parameters with its **recipe replaced by the recipe options, made from
    `RecipeOptions`' fields (one declaration, as generate and calibrate make theirs)."""
    from sagevideo.jobs.recipe import RecipeOptions

    params = inspect.signature(command, eval_str=True).parameters.values()  # typer reads no strings from __signature__
    params = [p for p in params if p.kind != inspect.Parameter.VAR_KEYWORD]
    command.__signature__ = inspect.Signature([*params, *config_parameters(RecipeOptions, {})])  # type: ignore[attr-defined]
    return command


def register(app: typer.Typer) -> None:
    from sagevideo.jobs.recipe import RecipeOptions

    app.command("eval")(eval_command)
    recipe_lists = several_values(whole_number_lists(RecipeOptions))  # --linear-bf16-steps 0 -1
    app.command("ab", cls=recipe_lists)(_with_recipe_options(ab_command))
    app.command("check-weights")(check_weights)
