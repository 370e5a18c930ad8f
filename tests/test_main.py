"""`python -m sagevideo` (sagevideo/__main__.py) runs the CLI."""

import subprocess
import sys


def test_python_dash_m_runs_the_cli():
    done = subprocess.run([sys.executable, "-m", "sagevideo", "generate", "--help"], capture_output=True, text=True)
    assert done.returncode == 0 and "Usage: sagevideo generate" in done.stdout and "--job-timeout" in done.stdout
