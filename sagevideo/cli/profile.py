"""`sagevideo profile`: one denoising step under torch.profiler (`ProfileConfig`'s fields as options)."""

from __future__ import annotations

from pathlib import Path

import typer

from sagevideo.cli.common import handle_errors, plain_help


def register(app: typer.Typer) -> None:
    app.command("profile")(profile)


def profile(
    model: str = typer.Option("tiny-cogvideox", help="transformer config: cogvideox-5b, wan-14b, hunyuanvideo, "
                              "opensora-768px (real size, random weights) or tiny-cogvideox|wan|hunyuanvideo|opensora"),
    frames: int = typer.Option(None, help="video frames (4k + 1); default: the model's"),
    resolution: str = typer.Option(None, help="HEIGHTxWIDTH in pixels, e.g. 480x720; default: the model's"),
    steps: int = typer.Option(1, help="denoising steps measured (after one warm-up step)"),
    recipe: str = typer.Option(None, help=plain_help("run the model as this bench forward recipe, "
                               "[fp8-](eager|compile)-(cudnn|sdpa|sage), e.g. fp8-compile-sage; default: stock")),
    device: str = typer.Option("auto", help="cuda, cpu, or auto"),
    json_out: Path = typer.Option(None, "--json", help="write the report as JSON here"),
    plot: Path = typer.Option(None, help="write a PNG of the split and the bounds here"),
    max_hours: float = typer.Option(1.0, min=0, help="refuse a run estimated to take longer than this on the CPU "
                                    "(0: no limit); the estimate is measured here before anything is allocated"),
) -> None:
    """Share of one denoising step in attention, linears and the rest, with each lever's Amdahl bound.

    Exit codes: 0 done, 2 bad input, or a run that cannot fit in memory or would take longer than
    --max-hours here (checked before building the model)."""
    from pydantic import ValidationError

    from sagevideo.errors import InputError

    with handle_errors("profile"):
        from sagevideo.experiments.bench.timing import ModelSizeOptions
        from sagevideo.experiments.profile import ProfileConfig, run_profile

        try:
            size = ModelSizeOptions(frames=frames, resolution=resolution)
            config = ProfileConfig(model=model, **size.size(), steps=steps, recipe=recipe, device=device,
                                   json_out=json_out, plot=plot, max_hours=max_hours)
        except ValidationError as err:
            from sagevideo.jobs.specs import problem_parts

            lines = [f"--{field.replace('_', '-')}: {msg}" for field, msg, _ in problem_parts(err)]
            raise InputError("; ".join(lines)) from None
        problem = size.size_problem(config.model)  # a latent shape the model cannot take
        if problem:
            raise InputError(problem)
        report = run_profile(config)
    typer.echo(report.table())
    shares = ", ".join(f"{part} {share:.0%}" for part, share in report.shares.items())
    written = [str(path) for path in (json_out, plot) if path is not None]
    typer.echo(f"sagevideo profile: {model}: {shares} of a step" + (f" -> {', '.join(written)}" if written else ""))
