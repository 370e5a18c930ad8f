"""`sagevideo convert-opensora SRC DST`: the official Open-Sora 2.0 download -> the folder --model loads.

Its options are `ConvertOpenSoraConfig`'s fields (one declaration each); the work is
`sagevideo.pipelines.opensora.official.convert_opensora` (torch, diffusers and transformers are
imported there, when the command runs).
"""

from __future__ import annotations

from typing import Any

import typer

from sagevideo.cli.common import add_config_command, handle_errors
from sagevideo.pipelines.opensora.official import ConvertOpenSoraConfig

CLI: dict[str, dict[str, Any]] = {
    "source": {"argument": True},
    "out": {"argument": True},
}

DOC = """Convert the official Open-Sora 2.0 download (Open_Sora_v2.safetensors, hunyuan_vae.safetensors and
    the T5 and CLIP folders) into a diffusers-style folder that `sagevideo generate --model DST` loads.
    Nothing is downloaded. DST is written as DST.partial and renamed when complete.

    Exit codes: 0 done, 2 bad input (missing parts, a checkpoint that does not fit, DST not empty)."""


def run(values: dict[str, Any]) -> None:
    from sagevideo.pipelines.opensora.official import convert_opensora

    with handle_errors("convert-opensora"):
        config = ConvertOpenSoraConfig.build(**values)
        out = convert_opensora(config, log=lambda line: typer.echo(f"sagevideo convert-opensora: {line}", err=True))
    typer.echo(f"sagevideo convert-opensora: wrote {out}; use it with --model {out}")


def register(app: typer.Typer) -> None:
    add_config_command(app, "convert-opensora", ConvertOpenSoraConfig, run, doc=DOC, cli=CLI)
