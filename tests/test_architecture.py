"""The layering of the rooms (docs/architecture.md), checked by a tool rather than by memory.

import-linter runs the contracts in pyproject.toml ([tool.importlinter]): the rooms' layers and
which room alone imports triton, diffusers, Ray and typer. torch.distributed, a subpackage that
import-linter cannot name, is checked here directly: only sagevideo/parallel/ imports it.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_import_linter_contracts_hold():
    """In a child process: import-linter sets up its logging with `logging.config.dictConfig`, which
    disables every logger that already exists in the calling process (Ray's, sagevideo's), so a later
    test of the same pytest worker that reads one through caplog would see nothing."""
    lint = ("import sys; from importlinter.cli import lint_imports; "
            "sys.exit(lint_imports(config_filename='pyproject.toml', no_cache=True))")
    # run in the project root: the contracts are read from its pyproject.toml, the package found there
    done = subprocess.run([sys.executable, "-c", lint], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_torch_distributed_only_in_parallel():
    package = ROOT / "sagevideo"
    offenders = sorted(
        str(path.relative_to(ROOT)) for path in package.rglob("*.py")
        if "parallel" not in path.relative_to(package).parts[:1]
        and any(name == "torch.distributed" or name.startswith("torch.distributed.") for name in _imports(path))
    )
    assert offenders == []
