"""The accuracy floors table (`eval/numerics/floors.py`): what it holds and how a miss reads."""

from sagevideo.eval.numerics.floors import CONTRACT, SHORTFALLS, Floors, contract_for, shortfall
from sagevideo.eval.numerics.presets import CONTRACT_PRESETS


def test_the_contract_is_design_s_figures():
    assert CONTRACT["fp16"] == Floors(cos_worst=0.999, cos_mean=0.9999, rel_l1_worst=0.03)
    assert CONTRACT["fp8"] == Floors(cos_worst=0.998, cos_mean=0.9993, rel_l1_worst=0.03)


def test_cosines_are_floors_and_rel_l1_a_ceiling():
    floors = CONTRACT["fp16"]
    assert floors.holds("cos_worst", 0.999) and not floors.holds("cos_worst", 0.9989)
    assert floors.holds("rel_l1_worst", 0.03) and not floors.holds("rel_l1_worst", 0.031)


def test_misses_name_each_metric_short_of_its_floor():
    stats = {"cos_worst": 0.9995, "cos_mean": 0.99946, "rel_l1_worst": 0.04}
    assert CONTRACT["fp16"].misses(stats) == ["cos_mean 0.99946 < 0.9999", "rel_l1_worst 0.04 > 0.03"]
    assert CONTRACT["fp8"].misses({"cos_worst": 1.0, "cos_mean": 1.0, "rel_l1_worst": 0.0}) == []


def test_exact_pv_takes_the_16_bit_floors_and_naive_int8_has_none():
    assert contract_for("fp32") is CONTRACT["fp16"] and contract_for("int8-naive") is None


def test_shortfalls_are_looser_than_the_contract_and_name_known_presets():
    for (pv, preset, metric), floor in SHORTFALLS.items():
        assert preset == "*" or preset in CONTRACT_PRESETS
        assert not CONTRACT[pv].holds(metric, floor) or floor == getattr(CONTRACT[pv], metric)
    assert shortfall("fp8", "random", "rel_l1_worst") == 0.05  # the "*" entry
    assert shortfall("fp16", "random", "cos_mean") is None
