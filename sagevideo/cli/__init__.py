"""The `sagevideo` command line (typer only): `app` in `sagevideo.cli.app`, one module per command group."""
