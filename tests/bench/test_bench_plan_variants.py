"""bench/bench_plan_variants.py's variant syntax (the GPU part runs on the H200 only)."""

import pytest

from bench import bench_plan_variants


def test_variants_parse_into_plan_field_overrides():
    variants = bench_plan_variants.parse_variants(
        "r128:max_registers=128;r128s2:max_registers=128,num_stages=2;i2f:scores_by_add=false")
    assert variants == {"r128": {"max_registers": 128}, "r128s2": {"max_registers": 128, "num_stages": 2},
                        "i2f": {"scores_by_add": False}}
    assert bench_plan_variants.parse_overrides("max_registers=none,num_stages=3") == {"max_registers": None,
                                                                                     "num_stages": 3}


@pytest.mark.parametrize("spec", ["r:block_m=128", "r:num_stages", "base:num_stages=2", ":num_stages=2",
                                  "r:scores_by_add=maybe"])
def test_bad_variants_are_refused_with_the_reason(spec):
    with pytest.raises(ValueError):
        bench_plan_variants.parse_variants(spec)


def test_command_line_errors_name_the_problem(capsys):
    with pytest.raises(SystemExit):
        bench_plan_variants.main(["--variants", "r:block_n=64"])
    assert "block_n=64" in capsys.readouterr().err
