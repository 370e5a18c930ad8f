"""Third-party chatter stays off the console (sagevideo/quiet.py): torchao's extension lines, torch's
`_pytree` deprecation for torchao's enums and diffusers' torchao line, which transformers' and
diffusers' imports of torchao printed before anything a user asked for."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
       "HF_HUB_OFFLINE": "1"}
CHATTER = ("Failed to load", "_C_mxfp8", "Unable to import `torchao` Tensor objects", "register_constant()",
           "_pytree")


def sagevideo_cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sagevideo", *map(str, args)], capture_output=True, text=True,
                          env=ENV, timeout=300)


def chatter_in(text: str) -> list[str]:
    return [line for line in text.splitlines() if any(c in line for c in CHATTER)]


def test_help_prints_only_the_help():
    done = sagevideo_cli("generate", "--help")
    assert done.returncode == 0 and "Usage: sagevideo generate" in done.stdout
    assert chatter_in(done.stdout + done.stderr) == []


@pytest.mark.slow
def test_a_tiny_generate_run_prints_no_third_party_chatter(tmp_path):
    """Loading the tiny pipeline imports transformers and diffusers, which import torchao."""
    done = sagevideo_cli("generate", "--prompt", "a fox", "--steps", "1", "--attention", "full", "--no-progress",
                         "--out", tmp_path / "out")
    assert done.returncode == 0, done.stderr
    assert "1 done" in done.stdout + done.stderr
    assert chatter_in(done.stdout + done.stderr) == []


def test_importing_sagevideo_and_its_cli_imports_no_torchao():
    code = ("import sys, sagevideo, sagevideo.cli.app; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torchao', 'diffusers', 'transformers')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_only_the_named_records_are_dropped():
    """Each logger gets its own capturing handler, enabled: another test (or a library's logging set-up
    run in this process, e.g. a dictConfig that disables existing loggers) may have disabled a logger
    or stopped it propagating to the root, where pytest's caplog listens."""
    import sagevideo  # noqa: F401  (installs the filters)

    seen: list[str] = []

    class Capture(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())

    names = ["torchao", "torch.utils._pytree", "diffusers.quantizers.torchao.torchao_quantizer",
             "torchao.quantization", "sagevideo"]
    loggers = [logging.getLogger(name) for name in names]
    saved = [(lg.level, lg.propagate, lg.disabled) for lg in loggers]
    handler = Capture()
    try:
        for lg in loggers:
            lg.addHandler(handler)
            lg.setLevel(logging.WARNING)
            lg.propagate = False  # each record reaches `handler` once, through its own logger
            lg.disabled = False
        logging.getLogger("torchao").warning("Failed to load /x/_C_mxfp8.so: Could not load this library")
        logging.getLogger("torch.utils._pytree").warning(
            "%s is an Enum subclass ... Calling register_constant() on Enum subclasses is deprecated", "<enum 'K'>")
        logging.getLogger("diffusers.quantizers.torchao.torchao_quantizer").warning(
            "Unable to import `torchao` Tensor objects. This may affect loading checkpoints serialized with `torchao`")
        logging.getLogger("torchao").warning("Skipping import of cpp extensions due to incompatible torch version")
        logging.getLogger("torchao.quantization").warning("Failed to load something a child logger says")
        logging.getLogger("sagevideo").warning("Failed to load the plan")
    finally:
        for lg, (level, propagate, disabled) in zip(loggers, saved, strict=True):
            lg.removeHandler(handler)
            lg.setLevel(level)
            lg.propagate, lg.disabled = propagate, disabled
    assert seen == [
        "Skipping import of cpp extensions due to incompatible torch version",
        "Failed to load something a child logger says",
        "Failed to load the plan",
    ]
