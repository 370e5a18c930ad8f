"""The `sagevideo` command line (typer): `app` in `sagevideo.cli.app`."""
