"""`sagevideo simulate`: its options are `SimulateConfig`'s fields (one declaration each)."""

from __future__ import annotations

import sys
from typing import Any

import typer

from sagevideo.cli.common import add_config_command, handle_errors
from sagevideo.errors import InputError
from sagevideo.eval.numerics.config import SimPV, SimulateConfig

CLI: dict[str, dict[str, Any]] = {
    "shape": {"type": str, "default": "1,8,1024,128"},  # SimulateConfig reads B,H,N,D
    "pv": {"type": list[SimPV]},
    "json_out": {"flags": ("--json",)},
    "qk_bits": {"range": True},
    "block_m": {"range": True},
    "block_n": {"range": True},
}

DOC = """Simulate quantized attention against exact fp64 attention: cosine, rel-L1, RMSE, worst first.

    Exit codes: 0 done, 2 bad input (checked before computing, including whether it fits in memory)."""


def run(values: dict[str, Any]) -> None:
    with handle_errors("simulate"):
        config = SimulateConfig.build(**values)
        shapes, variants = _check(config)
        results = _simulate(config, shapes, variants)
    import json

    from sagevideo.eval.numerics.simulate import format_table

    qkv, json_out = config.qkv, config.json_out
    source = str(qkv) if qkv else f"preset {config.preset} {config.shape} seed {config.seed}"
    typer.echo(f"inputs: {source}, dtype {config.dtype}; errors vs fp64 attention, per (batch, head)\n")
    typer.echo(format_table(results))
    if json_out is not None:
        json_out.write_text(json.dumps([r.summary() for r in results], indent=2))
    worst = min(results, key=lambda r: r.summary()["cos_worst"]).summary()
    typer.echo(f"\nsagevideo simulate: {len(results)} variants; worst cosine {worst['cos_worst']:.5f} "
               f"({worst['variant']}, {worst['worst_layer']} {worst['worst_head']})"
               + (f"; figures in {json_out}" if json_out else ""))


def _check(config: SimulateConfig) -> tuple[dict[str, tuple[int, int, int, int]], list[Any]]:
    """Everything that could fail after the computation, checked before it: ({layer: shape}, variants)."""
    from sagevideo.eval.numerics.simulate import estimate_bytes, qkv_file_shapes
    from sagevideo.generation.budget import available_bytes, format_bytes
    from sagevideo.outputs.files import writable_file

    qkv = config.qkv
    if qkv is not None and not qkv.is_file():
        raise InputError(f"--qkv {qkv}: no such file")
    if config.json_out is not None:
        writable_file(config.json_out, "--json", InputError, "figures.json")
    try:
        shapes = qkv_file_shapes(qkv, config.layout) if qkv is not None else {config.preset: config.shape}
    except ValueError as err:  # the message starts with the file's path
        raise InputError(f"--qkv {err}") from None
    variants = config.variants()
    need, have = estimate_bytes(shapes.values(), variants, config.dtype), available_bytes("cpu") or 0
    if have and need > have:
        b, h, n, d = max(shapes.values(), key=lambda x: x[0] * x[1] * x[2] ** 2)
        fits = max(128, int((have / 2 / (16 * b * h)) ** 0.5) // 128 * 128)
        raise InputError(
            f"needs about {format_bytes(need)} of memory (the exact fp64 reference holds B·H·N² = {b}·{h}·{n}² "
            f"scores), this machine has {format_bytes(have)} available; use fewer tokens or heads, e.g. "
            f"--shape {b},{h},{min(fits, n)},{d}" + (" (or a --qkv file with shorter sequences)" if qkv else "")
        )
    return shapes, variants


def _simulate(config: SimulateConfig, shapes: dict, variants: list[Any]) -> list[Any]:
    from tqdm.auto import tqdm

    from sagevideo.eval.numerics import simulate as simulation  # looked up per call: tests patch simulate

    bar = tqdm(total=len(shapes) * (len(variants) + 1), desc="simulate", unit="run", file=sys.stderr,
               dynamic_ncols=True, leave=False)
    started = []

    def step(text: str) -> None:  # called before each run: the bar counts the finished ones
        bar.update(1 if started else 0)
        started.append(text)
        bar.set_postfix_str(text[:60], refresh=True)

    try:
        return simulation.simulate(
            variants, preset=config.preset, shape=config.shape, seed=config.seed,
            qkv_file=None if config.qkv is None else str(config.qkv), layout=config.layout, dtype=config.dtype,
            progress=step,
        )
    except (ValueError, FileNotFoundError) as err:
        raise InputError(str(err)) from None
    finally:
        bar.close()


def register(app: typer.Typer) -> None:
    add_config_command(app, "simulate", SimulateConfig, run, doc=DOC, cli=CLI)
