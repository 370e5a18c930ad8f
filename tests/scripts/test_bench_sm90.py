"""scripts/bench_sm90.py's variant names (the GPU part runs on the H200 only)."""

import inspect
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import bench_sm90  # noqa: E402


def test_variant_names_become_launcher_keyword_arguments():
    from sagevideo.kernels.attention_sm90 import attention_forward_sm90

    variants = bench_sm90.parse_variants("s2c1,p3d1c2a,s4r2c1i")
    assert variants["s2c1"] == {"pipeline_qk": False, "num_stages": 2, "drop": 0, "release": 1, "consumers": 1,
                                "scores_by_add": None}
    assert variants["p3d1c2a"] == {"pipeline_qk": True, "num_stages": 3, "drop": 1, "release": 1, "consumers": 2,
                                   "scores_by_add": True}
    assert variants["s4r2c1i"]["release"] == 2 and variants["s4r2c1i"]["scores_by_add"] is False
    # every key is a keyword the launcher takes
    assert set(variants["s2c1"]) <= set(inspect.signature(attention_forward_sm90).parameters)


@pytest.mark.parametrize("name", ["s", "x2", "s2c1d1", "s2c3", "p3q"])
def test_bad_variant_names_are_refused(name):
    with pytest.raises(SystemExit, match="bad variant"):
        bench_sm90.parse_variants(name)
