"""The attention probe names layers whose scores are too peaky for INT8."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.usefixtures("one_thread")


def test_the_probe_names_layers_too_peaky_for_int8():
    """q, k x30 (score std ~900): every quantized mode falls to cosine ~0.97 while SDPA stays exact;
    the probe must name such a layer, with its score std, and say to keep it in full precision."""
    import torch

    from sagevideo.experiments.probe import ProbeRouter, summarize_probe
    from sagevideo.pipelines.plans import AttentionPlan

    router = ProbeRouter(AttentionPlan.uniform("int8-fp16"), "reference")
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 256, 64, generator=gen) for _ in range(3))
    router("blocks.0.attn", q * 30, k * 30, v)
    router("blocks.1.attn", q, k, v)
    summary = summarize_probe(router.recorder, ["a prompt"])
    assert [p["layer"] for p in summary["peaky_layers"]] == ["blocks.0.attn"]
    assert summary["peaky_layers"][0]["score_std"] > 500 and summary["peaky_layers"][0]["cos_worst"] < 0.99
    assert "full precision" in summary["peaky_advice"]


@pytest.mark.slow  # an end-to-end benchmark run, seconds
def test_a_rerun_takes_the_arms_recipe_and_reproduces_its_videos(tmp_path, monkeypatch):
    """An arm made with a step cache re-runs with that cache (its skipped forwards skipped again),
    so the probed videos are the arm's; compile is left out of the re-run (the probe is Python)."""
    import sagevideo
    from sagevideo.experiments import probe

    out = tmp_path / "arm"
    records = sagevideo.generate("a red panda", out=out, steps=3, progress=False, cache="first-block",
                                 cache_threshold=5.0, compile="regional", compile_backend="eager")
    assert probe._rerun_recipe(records[0]["recipe"]) == sagevideo.Recipe(cache="first-block", cache_threshold=5.0)
    rerun = probe.rerun_arm(records, arm_dir=out)
    assert rerun["reproduced"]["all_identical"], rerun["reproduced"]
    monkeypatch.setattr(probe, "_rerun_recipe", lambda recorded: None)  # as before: the re-run ran plain
    assert not probe.rerun_arm(records, arm_dir=out, probe=False)["reproduced"]["all_identical"]


def test_the_probes_floor_is_torchs_sdpa_also_under_the_global_replacement(monkeypatch):
    """The floor (SDPA in the input dtype against fp32 SDPA) is torch's own SDPA, also where user code
    has replaced F.scaled_dot_product_attention with a quantized one: fp32 inputs, so the floor is 0."""
    import functools

    import torch
    import torch.nn.functional as F

    import sagevideo
    from sagevideo.experiments.probe import ProbeRouter
    from sagevideo.pipelines.plans import AttentionPlan

    monkeypatch.setattr(F, "scaled_dot_product_attention",
                        functools.partial(sagevideo.scaled_dot_product_attention, backend="reference"))
    router = ProbeRouter(AttentionPlan.uniform("int8-fp16"), "reference")
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 64, 64, generator=gen) for _ in range(3))
    router("blocks.0.attn", q, k, v)
    (floor,) = router.recorder.floor.values()
    (test,) = router.recorder.test.values()
    assert floor.rel_l1_worst == 0.0 and test.rel_l1_worst > 0.0
