"""bench/bench_sm90.py's ring-stage list (the GPU part runs on the H200 only)."""

import pytest

from bench import bench_sm90


def test_stages_become_labelled_gluon_variants():
    assert bench_sm90.parse_stages("2,3p,4pv2,3v1") == {"s2": (2, False, 0), "s3p": (3, True, 0),
                                                         "s4pv2": (4, True, 2), "s3v1": (3, False, 1)}
    assert bench_sm90.parse_stages(bench_sm90.STAGES) == {"s2": (2, False, 0), "s3": (3, False, 0)}


@pytest.mark.parametrize("spec", ["", "0", "s2", "2,x", "-1", "p", "0p", "3pp", "2v3", "3pv1", "v2"])
def test_bad_stage_lists_are_refused(spec):
    with pytest.raises(SystemExit, match="bad ring stages"):
        bench_sm90.parse_stages(spec)
