"""Evaluation metrics on synthetic arms: identical arms, noise monotonicity, local models, skips."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from tests.helpers.evalkit import FAST, PROMPTS, base_video, make_arm, run_eval

from sagevideo.eval.evaluate import EvalOptions, evaluate

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


def test_clipsim_matches_a_direct_clip_forward(arms, by_noise, weights_dir):
    """CLIPSIM through the local folder equals plain cosine of CLIPModel's own embeddings."""
    from transformers import CLIPModel, CLIPProcessor

    from sagevideo.eval.videos import read_frames
    from sagevideo.eval.weights import CLIP_FOLDER

    result = by_noise[10]
    model = CLIPModel.from_pretrained(weights_dir / CLIP_FOLDER, local_files_only=True).eval()
    processor = CLIPProcessor.from_pretrained(weights_dir / CLIP_FOLDER, local_files_only=True)
    frames = read_frames(
        arms["ref"] / json.loads((arms["ref"] / "manifest.jsonl").read_text().splitlines()[0])["outputs"][0]
    )
    inputs = processor(text=[PROMPTS[0]], images=list(frames), return_tensors="pt", padding="max_length", max_length=77)
    with torch.no_grad():
        output = model(**inputs)
    cos = (
        torch.nn.functional.normalize(output.image_embeds.double(), dim=-1)
        @ torch.nn.functional.normalize(output.text_embeds.double(), dim=-1).T
    )
    assert result["metrics"]["clipsim"]["per_pair"][0]["ref"] == pytest.approx(cos.mean().item(), abs=1e-5)
    assert result["metrics"]["clipsim"]["clip"]["source"].endswith(CLIP_FOLDER)


def test_long_prompt_is_reported_not_silently_truncated(weights_dir, tmp_path):
    long_prompt = " ".join(["snow"] * 30)  # 4-5 tokens a word with the tiny letter vocabulary: > 77
    videos = [(long_prompt, 0, base_video(0)), ("short", 0, base_video(1))]
    ref = make_arm(tmp_path / "ref", videos)
    lines = []
    result = run_eval(ref, ref, tmp_path / "out", weights_dir, metrics=["clipsim"], echo=lines.append)
    reports = result["metrics"]["clipsim"]["long_prompts"]
    assert [r["prompt"] for r in reports] == [long_prompt] and reports[0]["tokens"] > 77 == reports[0]["limit"]
    assert any("exceed CLIP's 77 tokens" in n for n in result["notes"])
    assert any("truncated" in line for line in lines)


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


def test_metric_classes_reset_and_psnr_inf():
    from sagevideo.eval.frame_metrics import VideoPSNR, VideoSSIM

    video = torch.rand(3, 3, 16, 16)
    psnr, ssim = VideoPSNR(), VideoSSIM()
    psnr.update(video, video)
    other = video.clone()
    other[0] += 0.01
    psnr.update(video, other.clamp(0, 1))
    values = psnr.compute().reshape(-1)
    assert values[0] == math.inf and math.isfinite(values[1]) and int(psnr.identical_frames) == 5
    psnr.reset()
    with pytest.warns(UserWarning, match="before the ``update``"):
        assert psnr.compute().numel() == 0
    ssim.update(video, video)
    assert ssim.compute().item() == pytest.approx(1.0)
    with pytest.raises(ValueError):
        psnr.update(video, video[:2])


def test_bootstrap_ci_over_prompts_averages_seeds_first():
    from sagevideo.eval.stats import summarize

    values = [1.0, 3.0, 10.0, 10.0]
    prompts = ["a", "a", "b", "b"]
    s = summarize(values, prompts, FAST)
    assert s["mean"] == pytest.approx(6.0) and s["n"] == 4 and s["n_prompts"] == 2
    assert s["ci95"][0] >= 2.0 - 1e-9 and s["ci95"][1] <= 10.0 + 1e-9
    assert summarize([math.inf, math.inf], ["a", "b"], FAST)["mean"] == math.inf
    mixed = summarize([math.inf, 30.0, 40.0], ["a", "b", "c"], FAST)
    assert mixed["mean"] == pytest.approx(35.0) and mixed["n_infinite"] == 1
    assert np.isfinite(mixed["ci95"]).all()


@pytest.mark.parametrize("net", ["alex", "vgg"])
def test_local_lpips_equals_torchmetrics_lpips(net, tmp_path, monkeypatch):
    """Same backbone weights: LocalLPIPS gives torchmetrics' LPIPS (its _LPIPS module, whose
    torchvision backbone is swapped for ours because torchvision cannot be imported here)."""
    from torchmetrics.functional.image import lpips as tm_lpips

    from sagevideo.eval.lpips import LocalLPIPS, backbone_features

    torch.manual_seed(5)
    features = backbone_features(net)
    path = tmp_path / "backbone.pth"
    torch.save({f"features.{k}": v for k, v in features.state_dict().items()}, path)
    monkeypatch.setattr(tm_lpips, "_get_tv_model_features", lambda name, pretrained=False: features)
    reference = tm_lpips._LPIPS(pretrained=True, net=net)
    ours = LocalLPIPS(path, net)
    a, b = torch.rand(2, 3, 64, 64) * 2 - 1, torch.rand(2, 3, 64, 64) * 2 - 1
    with torch.no_grad():
        expected = reference(a, b).reshape(-1)
        got = ours(a, b)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-7)
    assert (got > 0).all()
