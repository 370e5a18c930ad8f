"""The simulator reproduces the seed document's figures and reads captured Q/K/V files."""

import pytest
import torch
from safetensors.torch import save_file

from sagevideo.attention.accuracy import error_stats
from sagevideo.eval.numerics.simulate import Variant, format_table, load_qkv_file, simulate, variant_grid

SEED_SHAPE = (1, 8, 1024, 128)


@pytest.fixture(scope="module")
def seed_results():
    """The seed document's recipe: N(0,1) q/k/v, channel 7 of K offset by 8, B=1 H=8 N=1024 D=128."""
    grid = variant_grid(["fp16", "int8-naive"], [False, True], [False], block_m=64, block_n=64)
    results = simulate(grid, preset="k-offset", shape=SEED_SHAPE, seed=0)
    return {(r.variant.pv, r.variant.smooth_k): r.summary() for r in results}


def test_smoothing_roughly_halves_int8_qk_rel_l1(seed_results):
    off, on = seed_results[("fp16", False)], seed_results[("fp16", True)]
    assert off["rel_l1_mean"] == pytest.approx(0.025, abs=0.004)  # seed: "expect roughly 2.5%"
    assert on["rel_l1_mean"] == pytest.approx(0.013, abs=0.003)  # seed: "falling to 1.3%"
    assert on["rel_l1_mean"] < 0.6 * off["rel_l1_mean"]


def test_naive_int8_pv_cosine_near_071(seed_results):
    for smooth in (False, True):
        assert seed_results[("int8-naive", smooth)]["cos_mean"] == pytest.approx(0.71, abs=0.02)
        assert seed_results[("int8-naive", smooth)]["cos_worst"] < 0.72


def test_worst_is_reported_not_only_mean(seed_results):
    for summary in seed_results.values():
        assert summary["cos_worst"] <= summary["cos_mean"]
        assert summary["rel_l1_worst"] >= summary["rel_l1_mean"]
        assert summary["worst_head"].startswith("b0h")


def test_captured_file_with_layers_names_the_worst_layer(tmp_path):
    gen = torch.Generator().manual_seed(0)
    tensors = {}
    for layer in ("blocks.0.attn", "blocks.1.attn"):
        for role in "qkv":
            tensors[f"{layer}.{role}"] = torch.randn(1, 2, 128, 64, generator=gen)
    tensors["blocks.1.attn.q"][..., 5] *= 30  # a Q channel outlier only in layer 1
    path = tmp_path / "qkv.safetensors"
    save_file(tensors, str(path))
    (result,) = simulate([Variant(pv="fp16", rotate_qk=False)], qkv_file=str(path))
    assert {r.layer for r in result.layers} == {"blocks.0.attn", "blocks.1.attn"}
    assert result.summary()["worst_layer"] == "blocks.1.attn"
    assert "blocks.1.attn" in format_table([result])


def test_bad_capture_file_is_refused_clearly(tmp_path):
    path = tmp_path / "bad.safetensors"
    save_file({"layer.q": torch.zeros(1, 1, 4, 8), "layer.k": torch.zeros(1, 1, 4, 8)}, str(path))
    with pytest.raises(ValueError, match=r"layer 'layer' lacks \['v'\]"):
        load_qkv_file(path)
    with pytest.raises(FileNotFoundError, match="no such file"):
        load_qkv_file(tmp_path / "missing.safetensors")


def test_more_bits_less_error():
    x = simulate(variant_grid(["fp32"], [True], [False], qk_bits=4), shape=(1, 2, 256, 64))
    y = simulate(variant_grid(["fp32"], [True], [False], qk_bits=8), shape=(1, 2, 256, 64))
    assert y[0].summary()["rel_l1_worst"] < 0.2 * x[0].summary()["rel_l1_worst"]


def test_error_stats_counts_nonfinite():
    ref = torch.ones(1, 1, 4, 4)
    out = ref.clone()
    out[0, 0, 0, 0] = float("nan")
    e = error_stats(ref, out)
    assert e.nonfinite == 1 and e.cos_worst == -1.0


def test_each_variant_is_judged_against_the_contract_floors_of_its_pv_mode(seed_results):
    """The verdict column reads `floors.CONTRACT`: smoothed INT8 QK + 16-bit PV meets it on the seed
    inputs, unsmoothed K misses on rel-L1 (the seed's 2.5%) or cosine, naive INT8 PV has no contract."""
    assert seed_results[("fp16", True)]["contract"] == "meets"
    assert seed_results[("fp16", False)]["contract"].startswith("short: ")
    assert seed_results[("int8-naive", True)]["contract"] == "-"


def test_the_table_shows_the_contract_verdict():
    (result,) = simulate([Variant(pv="fp8")], preset="random", shape=(1, 2, 256, 64), seed=0)
    assert format_table([result]).splitlines()[0].endswith("contract")
    assert format_table([result]).splitlines()[2].endswith(result.summary()["contract"])
