"""tools/sass_loop_mix.py on CPU: the plain kernel's block-sparse launch compiles for sm_90, and its
main loops (unchecked and checked key tiles, read from the tile lists) are the dense launch's loops:
two tensor-core loops, within a few instructions of the dense ones per key tile.

Opt-in (`pytest -m sass`): it asserts facts of the machine code, which a Triton upgrade may move.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.sass

SCRIPT = Path(__file__).parents[2] / "tools" / "sass_loop_mix.py"


def _loops(*args: str) -> list[int]:
    """Instructions per tile of each MMA loop the script prints."""
    # A fresh process without TRITON_INTERPRET (the root conftest sets it; compiling needs it unset).
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(SCRIPT.parents[1]), env.get("PYTHONPATH", "")])  # this checkout's package
    done = subprocess.run([sys.executable, str(SCRIPT), "--kernels", "plain", "--dims", "64", *args], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return [int(n) for n in re.findall(r"loop \S+: (\d+) instructions", done.stdout)]


@pytest.mark.parametrize("pv", ["fp16", "fp8"])
def test_the_sparse_launch_runs_the_dense_loops(pv):
    dense, sparse = _loops("--pv", pv, "--scores-by-add", "off"), _loops("--pv", pv, "--sparse")
    assert len(dense) == len(sparse) == 2
    for d, s in zip(dense, sparse, strict=True):
        assert abs(s - d) <= 0.05 * d, (dense, sparse)
