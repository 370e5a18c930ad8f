"""Every repository path that README.md, docs/*.md and the docstrings of sagevideo/ name exists.

Paths are written from the repository root (`sagevideo/jobs/config.py`, `tests/...`, `bench/...`,
`tools/...`, `docs/...`, `examples/...`) or from the package (`generation/plan.py`, `pipelines/
cogvideox/family.py`). Not checked: placeholders (an upper-case part: `bench/NAME.py`), files in
history written as `git show COMMIT:path`, and docs/benchmarks-history.md, whose dated entries
name files as they were then (the commits of the removed ones are listed on that page).
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HISTORY = ROOT / "docs" / "benchmarks-history.md"
TOP = ("sagevideo", "tests", "bench", "tools", "docs", "examples")
ROOMS = sorted(p.name for p in (ROOT / "sagevideo").iterdir() if (p / "__init__.py").is_file())
# Not after a word, path or `COMMIT:` character: a path starts there.
FROM_ROOT = re.compile(r"(?<![\w./:-])((?:" + "|".join(TOP) + r")/[\w./-]*\w)")
FROM_PACKAGE = re.compile(r"(?<![\w./:-])((?:" + "|".join(ROOMS) + r")/[\w/]*\w\.py)\b")


def docstrings(path: Path) -> str:
    """Every module, class and function docstring of one source file, joined."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    nodes = (n for n in ast.walk(tree) if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef,
                                                          ast.AsyncFunctionDef)))
    return "\n".join(d for n in nodes if (d := ast.get_docstring(n, clean=False)))


@functools.cache
def sources() -> dict[str, str]:
    """{repository-relative name: the text whose paths must exist}."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    out = {p.relative_to(ROOT).as_posix(): p.read_text(encoding="utf-8") for p in pages if p != HISTORY}
    for path in sorted((ROOT / "sagevideo").rglob("*.py")):
        out[path.relative_to(ROOT).as_posix()] = docstrings(path)
    return out


def named_paths(text: str) -> set[str]:
    """The repository paths `text` names, from the root (package-relative ones prefixed), without
    placeholders."""
    found = {m.rstrip(".") for m in FROM_ROOT.findall(text)}
    found |= {f"sagevideo/{m}" for m in FROM_PACKAGE.findall(text)}
    return {p for p in found if not any(part.isupper() for part in re.split(r"[/.]", p))}


def test_named_paths_are_recognised():
    text = ("see `sagevideo/jobs/config.py`, generation/plan.py and tests/test_architecture.py; "
            "bench/NAME.py is a placeholder and `git show 0a1b2c3:tools/gone.py` is history")
    assert named_paths(text) == {"sagevideo/jobs/config.py", "sagevideo/generation/plan.py",
                                 "tests/test_architecture.py"}


@pytest.mark.parametrize("source", sorted(sources()))
def test_every_named_path_exists(source):
    missing = sorted(p for p in named_paths(sources()[source]) if not (ROOT / p).exists())
    assert not missing, f"{source} names paths that do not exist: {missing}"
