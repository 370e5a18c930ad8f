"""sagevideo/experiments/environment.py: whether a worker's big imports find their bytecode."""

import py_compile
import sys

from sagevideo.experiments import environment


def test_sources_without_cached_bytecode_are_found(tmp_path):
    compiled, bare = tmp_path / "compiled.py", tmp_path / "bare.py"
    compiled.write_text("x = 1\n")
    bare.write_text("y = 2\n")
    py_compile.compile(str(compiled), cfile=None)  # where the interpreter looks for it
    assert environment.without_bytecode([str(compiled), str(bare)]) == [str(bare)]


def test_the_bytecode_line_says_what_a_worker_start_pays(monkeypatch):
    monkeypatch.setattr(environment, "without_bytecode", lambda sources: sources)
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    line = environment.bytecode_line()
    assert line.startswith("none for torch, diffusers, transformers, and PYTHONDONTWRITEBYTECODE is set")
    assert "python -m compileall" in line and "PYTHONPYCACHEPREFIX" in line
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    assert environment.bytecode_line().startswith("none yet for torch, diffusers, transformers: written by the first")
    monkeypatch.setattr(environment, "without_bytecode", lambda sources: [])
    assert environment.bytecode_line().startswith("cached for torch, diffusers, transformers")
