"""CLIPSIM on the tiny local CLIP: equal to a direct CLIP forward; prompts past 77 tokens are
reported, not truncated silently."""

from __future__ import annotations

import json

import pytest
import torch

from tests.helpers.evalkit import PROMPTS, base_video, make_arm, run_eval

pytestmark = pytest.mark.usefixtures("one_thread")


def test_clipsim_matches_a_direct_clip_forward(arms, by_noise, weights_dir):
    """CLIPSIM through the local folder equals plain cosine of CLIPModel's own embeddings."""
    from transformers import CLIPModel, CLIPProcessor

    from sagevideo.eval.weights import CLIP_FOLDER
    from sagevideo.outputs.video import read_frames

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
