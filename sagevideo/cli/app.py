"""The `sagevideo` command line: a thin typer layer over the Python API (the console script's entry).

One module per command group; each command's options are its config's fields (`cli.common.
add_config_command`), and it builds that one config object and maps errors to exit codes through
`sagevideo.errors` (`cli.common.handle_errors`): generate (`GenerateConfig`), calibrate
(`CalibrateConfig`), simulate (`SimulateConfig`), eval (`EvalConfig`), ab (`ABConfig` with the
evaluation's `EvalSettings`), check-weights (`WeightsOptions`), env (no options), convert-opensora
(`ConvertOpenSoraConfig`), profile (`ProfileConfig`), bench attention/forward
(`BenchAttentionConfig`, `BenchForwardConfig`).
Exit codes: 0 success, 1 a job or the model load
failed, 2 bad input (reported before any model loads), 130/143/129 interrupted. Heavy modules (torch,
diffusers, triton, ray) are imported inside the commands so `--help` stays instant.
"""

from __future__ import annotations

import typer

from sagevideo.cli import bench, calibrate, convert_opensora, env, evaluate, generate, profile, simulate

app = typer.Typer(
    name="sagevideo",
    help="Fast long-sequence video diffusion with SageAttention-style quantized attention.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
)


@app.callback()
def main() -> None:
    """Fast long-sequence video diffusion with SageAttention-style quantized attention."""


for group in (generate, env, simulate, calibrate, evaluate, convert_opensora, profile, bench):
    group.register(app)
