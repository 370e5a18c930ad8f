"""`python -m sagevideo ...`: the `sagevideo` command where its console script is not installed
(e.g. a checkout on PYTHONPATH)."""

from sagevideo.cli.app import app

app(prog_name="sagevideo")
