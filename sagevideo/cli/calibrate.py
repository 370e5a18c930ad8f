"""`sagevideo calibrate`: its options are `CalibrateConfig`'s fields (one declaration each)."""

from __future__ import annotations

from typing import Any

import typer

from sagevideo.cli.common import add_config_command, handle_errors
from sagevideo.experiments.calibrate import CalibrateConfig

CLI: dict[str, dict[str, Any]] = {
    "prompts_file": {"argument": True},
    "out": {"flags": ("--out", "-o")},
    "prompts": {"flags": ("--prompt", "-p"), "type": list[str]},
    "capture_steps": {"type": str},  # '0,1,-1'; CalibrateConfig reads it
    "progress": {"flags": ("--progress/--no-progress",)},
}
API_ONLY = ("guidance",)

DOC = """Measure each attention layer's error per mode on real prompts and write the fastest plan that
    meets the threshold (full precision where no mode does).

    The speed recipe: --linear fp8 (--linear-keep) is applied before measuring (FP8 linears change
    what attention sees); --compile is accepted and not applied (noted in the plan); --cache is
    refused (it skips the forwards whose attention is measured). The plan's "recipe" records it.
    --sparse METHOD:DENSITY measures each layer's sparse error against the same mode dense at DENSITY,
    2x and 4x DENSITY, and writes per layer the sparsest that keeps --sparse-budget (the first fifth
    of the steps, the first layer and over-budget layers dense): judge the plan with `sagevideo ab --plan`.

    Exit codes: 0 done, 2 bad input (nothing was loaded)."""


def run(values: dict[str, Any]) -> None:
    from sagevideo.experiments.calibrate import calibrate

    values["prompts"] = values["prompts"] or None
    with handle_errors("calibrate"):
        config = CalibrateConfig.build(**values)
        result = calibrate(config)
    from sagevideo.pipelines.calibrate import CANDIDATES

    typer.echo(result.table())
    name, worst = result.worst_layer()
    overrides = len(result.plan.overrides)
    typer.echo(
        f"\nsagevideo calibrate: {len(result.errors)} layers -> {config.out} (default {result.plan.default.label}, "
        f"{overrides} override{'s' if overrides != 1 else ''}); worst layer {name}: cosine {worst.cos:.5f} "
        f"with {CANDIDATES[0].label} at step {worst.step}"
        + (f"; Q/K/V in {config.save_qkv}" if config.save_qkv else "")
    )
    recipe = result.plan.recipe
    if recipe is not None:
        note = f"; {recipe['note']}" if "note" in recipe else ""
        typer.echo(f"sagevideo calibrate: measured with --linear {recipe['linear']} (the plan's recipe){note}")
    if result.sparse is not None:
        typer.echo(f"sagevideo calibrate: {result.sparse.note()}")
        if result.sparse.chosen:
            typer.echo(f"sagevideo calibrate: sparse layers (worst over the captured calls against the same mode "
                       f"dense):\n{result.sparse.table()}")
        if result.sparse.dense:
            typer.echo(f"sagevideo calibrate: dense layers:\n{result.sparse.dense_note()}")
        if result.plan.uses_sparse:
            first = next(o.steps[0] for o in result.plan.overrides if o.sparse is not None)
            typer.echo(f"sagevideo calibrate: sparse from step {first} on; judge the plan with `sagevideo ab --plan` "
                       "on your own model and prompts (random weights say nothing about sparsity)")
    if result.peaky_note():
        typer.echo(f"sagevideo calibrate: {result.peaky_note()}")


def register(app: typer.Typer) -> None:
    add_config_command(app, "calibrate", CalibrateConfig, run, doc=DOC, cli=CLI, skip=API_ONLY)
