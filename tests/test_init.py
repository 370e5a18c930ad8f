"""`import sagevideo` stays light: the package, the CLI and the driver modules load neither
diffusers, triton nor ray."""

import subprocess
import sys


def test_imports_stay_light():
    """`import sagevideo`, the CLI module and the generation/scheduling modules load neither diffusers,
    triton nor ray (Ray is imported only when a batch runs on it)."""
    code = (
        "import sys, sagevideo, sagevideo.cli.app, sagevideo.jobs.specs, sagevideo.jobs.files, "
        "sagevideo.generation.generate, sagevideo.scheduling; "
        "print([m for m in ('diffusers', 'transformers', 'triton', 'ray', 'torch') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
