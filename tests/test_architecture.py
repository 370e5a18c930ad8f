"""The layering of the rooms (docs/architecture.md), checked by a tool rather than by memory.

import-linter runs the contracts in pyproject.toml ([tool.importlinter]): the rooms' layers and
which room alone imports triton, diffusers, Ray and typer. torch.distributed, a subpackage that
import-linter cannot name, is checked here directly: only sagevideo/parallel/ imports it.
"""

from __future__ import annotations

import ast
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_import_linter_contracts_hold():
    from importlinter.cli import lint_imports

    cwd = os.getcwd()
    os.chdir(ROOT)  # the contracts are read from pyproject.toml in the project root
    try:
        assert lint_imports(config_filename=str(ROOT / "pyproject.toml"), no_cache=True) == 0
    finally:
        os.chdir(cwd)


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
