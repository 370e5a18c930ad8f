"""`sagevideo bench attention` and `sagevideo bench forward`: their options are
`BenchAttentionConfig`'s and `BenchForwardConfig`'s fields (one declaration each)."""

from __future__ import annotations

from typing import Any

import typer

from sagevideo.cli.common import add_config_command, handle_errors
from sagevideo.experiments.bench.attention import BenchAttentionConfig
from sagevideo.experiments.bench.forward import BenchForwardConfig

ATTENTION_CLI: dict[str, dict[str, Any]] = {
    "shapes": {"flags": ("--shape",)},
    "json_out": {"flags": ("--json",)},
    "reps": {"range": True},
}
FORWARD_CLI: dict[str, dict[str, Any]] = {
    "json_out": {"flags": ("--json",)},
    "repeats": {"range": True},
}

ATTENTION_DOC = """Time attention at your shapes: SDPA's backends and sagevideo's sageattn side by side in one
    run (round-robin medians, TOPS, ratios to the best SDPA backend and to cuDNN, worst cosine vs fp32).

    Exit codes: 0 done, 2 bad input (checked before any tensor is made)."""

FORWARD_DOC = """Time whole transformer forwards (random weights) per recipe, side by side in one run:
    eager/compile x cuDNN/sagevideo attention, fp8 linears; ratios to eager and compile cuDNN,
    output cosine vs eager cuDNN, first-call seconds, the attention backends that ran.

    Exit codes: 0 done, 2 bad input (checked before any model is built)."""


def _progress(line: str) -> None:
    typer.echo(f"sagevideo bench: {line}", err=True)


def _written(path: Any) -> str:
    return f" -> {path}" if path is not None else ""


def run_attention(values: dict[str, Any]) -> None:
    from sagevideo.experiments.bench.attention import resolve, run_bench_attention

    values.update(pv=values["pv"] or None, sdpa=values["sdpa"] or None)  # not given: the device's defaults
    with handle_errors("bench attention"):
        config = BenchAttentionConfig.build(**values)
        plan = resolve(config)
        report = run_bench_attention(config, progress=_progress, plan=plan)
    typer.echo(report.table())
    typer.echo(f"sagevideo bench attention: {report.summary()}{_written(config.json_out)}")


def run_forward(values: dict[str, Any]) -> None:
    from sagevideo.experiments.bench.forward import resolve, run_bench_forward

    with handle_errors("bench forward"):
        config = BenchForwardConfig.build(**values)
        plan = resolve(config)
        for name, why in plan.left_out.items():
            _progress(f"{name} left out of the default recipes: {why}")
        report = run_bench_forward(config, progress=_progress, plan=plan)
    typer.echo(report.table())
    typer.echo(f"sagevideo bench forward: {config.model}: {report.summary()}{_written(config.json_out)}")


def register(app: typer.Typer) -> None:
    bench = typer.Typer(help="Measure speed side by side: attention calls, whole transformer forwards.",
                        no_args_is_help=True)
    add_config_command(bench, "attention", BenchAttentionConfig, run_attention, doc=ATTENTION_DOC, cli=ATTENTION_CLI)
    add_config_command(bench, "forward", BenchForwardConfig, run_forward, doc=FORWARD_DOC, cli=FORWARD_CLI)
    app.add_typer(bench, name="bench")
