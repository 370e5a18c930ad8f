"""`evaluate()` on synthetic arms: identical arms, noise monotonicity, CIs and the noise floor, skips
for missing weights."""

from __future__ import annotations

import math

import pytest

from sagevideo.eval.evaluate import EvalOptions, evaluate
from tests.helpers.evalkit import FAST, PROMPTS

pytestmark = pytest.mark.usefixtures("one_thread")


def test_identical_arms(identical):
    m = identical["metrics"]
    assert list(m) == ["psnr", "ssim", "lpips", "clipsim", "clip_t", "fid", "kid"]
    assert m["psnr"]["difference"]["mean"] == math.inf  # every video identical: PSNR ∞, handled
    assert m["psnr"]["identical_videos"]["test"] == len(PROMPTS)
    assert m["ssim"]["difference"]["mean"] == pytest.approx(1.0)
    assert m["lpips"]["difference"]["mean"] == pytest.approx(0.0, abs=1e-7)
    assert m["clipsim"]["difference"]["mean"] == 0.0 and m["clipsim"]["difference"]["ci95"] == [0.0, 0.0]
    assert m["clip_t"]["difference"]["mean"] == 0.0
    assert m["fid"]["difference"]["mean"] == pytest.approx(0.0, abs=1e-6)
    # KID's unbiased estimator is slightly negative for identical sets (-(2/m)·(mean k(x,x) - mean k(x,y)))
    assert -0.01 < m["kid"]["difference"]["mean"] <= 1e-12
    assert m["kid"]["excess"]["mean"] == 0.0
    for key, entry in m.items():
        assert entry["verdict"]["within_noise_floor"] is True, (key, entry["verdict"])
        assert entry["n"] == len(PROMPTS)
    assert not m["fid"]["reliable"] and "2048" in m["fid"]["note"]
    assert identical["schema_version"] == 1


def test_noise_moves_every_metric_the_right_way(by_noise):
    def series(key, part="difference"):
        return [by_noise[s]["metrics"][key][part]["mean"] for s in (3, 10, 30)]

    def decreasing(xs):
        return all(a > b for a, b in zip(xs, xs[1:], strict=False))

    def increasing(xs):
        return all(a < b for a, b in zip(xs, xs[1:], strict=False))

    assert decreasing(series("psnr")) and math.isfinite(series("psnr")[0])
    assert decreasing(series("ssim"))
    assert increasing(series("lpips"))
    assert increasing(series("fid"))
    assert increasing(series("kid"))
    # independent per-frame noise decorrelates consecutive frames: CLIP-T of the test arm drops
    assert decreasing(series("clip_t", "test"))
    assert series("clip_t", "ref")[0] == series("clip_t", "ref")[2]
    # a random tiny CLIP knows no prompts, so CLIPSIM has no "right" sign: it moves away from the reference
    assert increasing([abs(x) for x in series("clipsim")])
    for s in (3, 10, 30):
        for key, entry in by_noise[s]["metrics"].items():
            if s >= 10 or key in ("psnr", "ssim", "lpips"):  # sigma 3 may hide in the set metrics' CIs
                assert entry["verdict"]["within_noise_floor"] is False, (s, key)
                assert entry["verdict"]["direction"] in ("worse", "better")
        assert by_noise[s]["metrics"]["psnr"]["verdict"]["direction"] == "worse"
        assert by_noise[s]["metrics"]["fid"]["verdict"]["direction"] == "worse"


def test_paired_metrics_have_ci_and_noise_floor(by_noise):
    m = by_noise[10]["metrics"]
    lo, hi = m["ssim"]["difference"]["ci95"]
    assert lo <= m["ssim"]["difference"]["mean"] <= hi
    assert m["ssim"]["noise_floor"]["mean"] == pytest.approx(1.0)
    assert m["clipsim"]["ref"]["mean"] is not None and m["clipsim"]["test"]["mean"] is not None
    assert m["kid"]["difference"]["std"] >= 0 and m["kid"]["subset_size"] == len(PROMPTS) * 9
    assert m["fid"]["features"]["resize"]["size"] == "native (no resize)"
    assert m["fid"]["difference"]["ci95"] is not None


def test_missing_weights_skip_with_one_line_each(arms, tmp_path):
    lines = []
    options = EvalOptions(weights=tmp_path / "empty", bootstrap=FAST)
    result = evaluate(arms["ref"], arms["noise3"], out=tmp_path / "out", options=options, echo=lines.append)
    assert list(result["metrics"]) == ["psnr", "ssim"]
    assert set(result["skipped"]) == {"lpips", "clipsim", "clip_t", "fid", "kid"}
    assert len(lines) == 3  # one line per weight group: CLIP, LPIPS, Inception
    assert all(line.startswith("sagevideo eval: ") and "skipped" in line for line in lines)
    assert any("clip-vit-base-patch32" in line for line in lines)
    # without a noise floor the verdict says so instead of guessing
    assert result["metrics"]["psnr"]["verdict"]["within_noise_floor"] is None
    assert "--noise-ref" in result["metrics"]["psnr"]["verdict"]["line"]
