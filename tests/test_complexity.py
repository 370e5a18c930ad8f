"""No function in the package above the cyclomatic complexity pyproject.toml sets ([tool.ruff.lint.mccabe])."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_no_function_in_the_package_is_above_the_complexity_limit():
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    if ruff is None:
        pytest.skip("ruff is not installed (the dev extra has it)")
    done = subprocess.run([ruff, "check", "--select", "C901", "--output-format", "concise", "sagevideo"],
                          cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, f"functions above the limit (split them):\n{done.stdout}{done.stderr}"
