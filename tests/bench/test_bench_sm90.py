"""bench/bench_sm90.py's Gluon variant list (the GPU part runs on the H200 only)."""

import pytest

from bench import bench_sm90


def test_stages_become_labelled_gluon_variants():
    assert bench_sm90.parse_stages("2,3") == {"s2": (2, 1), "s3": (3, 1)}
    assert bench_sm90.parse_stages(bench_sm90.STAGES) == {"s2": (2, 1), "s3": (3, 1)}


def test_two_consumers_are_a_variant_suffix():
    assert bench_sm90.parse_stages("2,2c2,3c2,3c1") == {"s2": (2, 1), "s2c2": (2, 2), "s3c2": (3, 2), "s3": (3, 1)}


@pytest.mark.parametrize("spec", ["", "0", "s2", "2,x", "-1", "2c3", "2c", "c2"])
def test_bad_stage_lists_are_refused(spec):
    with pytest.raises(SystemExit, match="bad Gluon variant"):
        bench_sm90.parse_stages(spec)
