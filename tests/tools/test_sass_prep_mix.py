"""tools/sass_prep_mix.py on CPU: the preparation kernels compile for sm_90 and quantize without
a division per element (an IEEE division is ~11 instructions with a slow-path check, FCHK).

Opt-in (`pytest -m sass`): it asserts facts of the machine code, which a Triton upgrade may move.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.sass

SCRIPT = Path(__file__).parents[2] / "tools" / "sass_prep_mix.py"


def _env():
    """A fresh process without TRITON_INTERPRET (the root conftest sets it; compiling needs it unset),
    importing this checkout's package."""
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(SCRIPT.parents[1]), env.get("PYTHONPATH", "")])
    return env


def test_quantization_programs_divide_per_group_not_per_element(tmp_path):
    env = _env()
    done = subprocess.run([sys.executable, str(SCRIPT), "--dims", "64", "--sass", str(tmp_path)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert len([line for line in done.stdout.splitlines() if "registers" in line]) == 3
    for kernel in ("quantize_q", "quantize_kv"):
        sass = (tmp_path / f"{kernel}-d64-fp8.sass").read_text()
        # 32+ elements per thread in each program; divisions only for the group scales
        assert 0 < sass.count("FCHK") <= 8, f"{kernel}: {sass.count('FCHK')} division checks"


def test_the_tile_selection_compiles_without_spilling_at_video_sizes():
    """The selection kernel holds ROWS x T_PAD scores per program (a fixed product): from 591 to 4,096 key
    tiles it compiles for sm_90 with at most a few bytes of stack, in the shared memory an SM has, by
    top_p and by a per-row density."""
    done = subprocess.run([sys.executable, str(SCRIPT), "--select", "--dims", "128"], env=_env(),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [line for line in done.stdout.splitlines() if "select_tiles" in line]
    assert len(lines) == 8 and sum("per-row density" in line for line in lines) == 4
    for line in lines:
        stack = int(line.split(" B stack")[0].rsplit(" ", 1)[1])
        shared = int(line.split(" B shared")[0].rsplit(" ", 1)[1])
        assert stack <= 16 and shared <= 64 * 1024, line


@pytest.mark.parametrize("pv", ["fp8", "fp16"])
def test_the_pooling_preparation_compiles_for_sm90(pv):
    """With the tile selection's pooling (and the key tiles' spread) on, the three preparation programs
    compile for sm_90 at d64 and d128: code the CPU interpreter runs can still fail to compile (a `None`
    returned from a jit helper under a constexpr switch runs there and does not compile), and off a GPU
    only this catches it."""
    done = subprocess.run([sys.executable, str(SCRIPT), "--dims", "64,128", "--pv", pv, "--pool", "--spread"],
                          env=_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert len([line for line in done.stdout.splitlines() if "registers" in line]) == 6
