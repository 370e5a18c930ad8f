"""bench/bench_sm90.py's Gluon variant list (the GPU part runs on the H200 only)."""

import pytest

from bench import bench_sm90


def test_stages_become_labelled_gluon_variants():
    assert bench_sm90.parse_stages("2,3") == {"s2": (2, 0), "s3": (3, 0)}
    assert bench_sm90.parse_stages(bench_sm90.STAGES) == {"s2": (2, 0), "s3": (3, 0)}


def test_emulated_exponentials_are_a_variant_suffix():
    assert bench_sm90.parse_stages("2,2e1,2e2,3e0") == {"s2": (2, 0), "s2e1": (2, 1), "s2e2": (2, 2), "s3": (3, 0)}


@pytest.mark.parametrize("spec", ["", "0", "s2", "2,x", "-1", "2e3", "2e", "e1"])
def test_bad_stage_lists_are_refused(spec):
    with pytest.raises(SystemExit, match="bad Gluon variant"):
        bench_sm90.parse_stages(spec)
