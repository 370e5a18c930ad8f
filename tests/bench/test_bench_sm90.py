"""bench/bench_sm90.py's ring-stage list (the GPU part runs on the H200 only)."""

import pytest

from bench import bench_sm90


def test_stages_become_labelled_gluon_variants():
    assert bench_sm90.parse_stages("2,3") == {"s2": 2, "s3": 3}
    assert bench_sm90.parse_stages(bench_sm90.STAGES) == {"s2": 2, "s3": 3}


@pytest.mark.parametrize("spec", ["", "0", "s2", "2,x", "-1"])
def test_bad_stage_lists_are_refused(spec):
    with pytest.raises(SystemExit, match="bad ring stages"):
        bench_sm90.parse_stages(spec)
