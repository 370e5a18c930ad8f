"""Helpers for the A/B evaluation tests: synthetic output folders and tiny local models.

Nothing here downloads: the CLIP model is a tiny random one saved to a folder (and loaded back
through the real local-path code), the LPIPS backbone is a random AlexNet `features` state dict
under torchvision's file name, and FID/KID use a tiny fixed feature extractor. The fixtures built
from these (arms, weights_dir, identical, by_noise, one_thread) are in tests/conftest.py.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import numpy as np
import torch
from torch import nn


@contextlib.contextmanager
def single_thread():
    """One intra-op thread for these small tensors: on the shared 2-core machines two threads
    contend with other processes and make tiny kernels 10-30x slower. Restored afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


PROMPTS = ["a red fox running through snow", "a lighthouse at dusk", "waves on a pebble beach"]
FRAMES, SIZE = 9, 64


def base_video(index: int, frames: int = FRAMES, size: int = SIZE) -> np.ndarray:
    """A smooth, slowly moving random pattern (F, H, W, 3) uint8, fixed per index."""
    rng = np.random.default_rng(100 + index)
    coarse = torch.from_numpy(rng.uniform(30, 225, size=(1, 3, 8, 8))).float()
    big = torch.nn.functional.interpolate(coarse, size=(size * 2, size * 2), mode="bicubic", align_corners=False)
    out = []
    for f in range(frames):
        shift = 2 * f
        out.append(big[0, :, shift : shift + size, shift : shift + size].permute(1, 2, 0).clamp(0, 255).numpy())
    return np.round(np.stack(out)).astype(np.uint8)


def noisy(frames: np.ndarray, sigma: float, seed: int) -> np.ndarray:
    if sigma == 0:
        return frames.copy()
    rng = np.random.default_rng(seed)
    return np.clip(frames.astype(np.float64) + rng.normal(0, sigma, frames.shape), 0, 255).round().astype(np.uint8)


def make_arm(folder: Path, videos: list[tuple[str, int, np.ndarray]], **settings) -> Path:
    """A `sagevideo generate`-like output folder: one mp4 per video and a manifest record each."""
    from sagevideo.outputs.manifest import Manifest
    from sagevideo.outputs.video import write_mp4

    folder.mkdir(parents=True, exist_ok=True)
    manifest = Manifest(folder / "manifest.jsonl")
    for i, (prompt, seed, frames) in enumerate(videos):
        name = f"video-{i}-{seed}.mp4"
        write_mp4(frames, folder / name, fps=8, quality=10)
        record = {
            "job_id": f"job{i}-{seed}",
            "status": "done",
            "error": None,
            "prompt": prompt,
            "seed": seed,
            "frames": int(frames.shape[0]),
            "height": int(frames.shape[1]),
            "width": int(frames.shape[2]),
            "steps": 2,
            "guidance": 6.0,
            "negative_prompt": "",
            "model": "tiny",
            "model_fingerprint": "abc",
            "attention": "full",
            "pv": None,
            "backend": None,
            "plan": None,
            "plan_sha256": None,
            "device": "cpu",
            "dtype": "float32",
            "fps": 8,
            "backends": {"counts": {"sdpa": 4}, "fallbacks": {}},
            "outputs": [name],
            "sagevideo_version": "0.1.0",
        }
        record.update(settings)
        manifest.append(record)
    return folder


def arm_videos(sigma: float = 0.0, seed_offset: int = 0, prompts=PROMPTS) -> list[tuple[str, int, np.ndarray]]:
    return [(p, 0, noisy(base_video(i), sigma, seed=1000 * (seed_offset + 1) + i)) for i, p in enumerate(prompts)]


def tiny_clip(folder: Path) -> None:
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, CLIPProcessor, CLIPTokenizer

    folder.mkdir(parents=True, exist_ok=True)
    letters = "abcdefghijklmnopqrstuvwxyz"
    vocab = {c: i for i, c in enumerate(letters)}
    vocab.update({c + "</w>": len(letters) + i for i, c in enumerate(letters)})
    vocab["<|startoftext|>"] = len(vocab)
    vocab["<|endoftext|>"] = len(vocab)
    (folder / "vocab.json").write_text(json.dumps(vocab))
    (folder / "merges.txt").write_text("#version: 0.2\n")
    tokenizer = CLIPTokenizer(str(folder / "vocab.json"), str(folder / "merges.txt"))
    tokenizer.model_max_length = 77
    config = CLIPConfig(
        text_config=dict(
            vocab_size=len(vocab),
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            max_position_embeddings=77,
            bos_token_id=vocab["<|startoftext|>"],
            eos_token_id=vocab["<|endoftext|>"],
            pad_token_id=vocab["<|endoftext|>"],
        ),
        vision_config=dict(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            image_size=32,
            patch_size=8,
        ),
        projection_dim=16,
    )
    torch.manual_seed(0)
    CLIPModel(config).save_pretrained(folder)
    processor = CLIPProcessor(
        image_processor=CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}),
        tokenizer=tokenizer,
    )
    processor.save_pretrained(folder)


class TinyExtractor(nn.Module):
    """Fixed features for FID/KID: |zero-mean random 3x3 conv| pooled to 2x2, uint8 (N, 3, H, W) -> (N, 16).
    The absolute value makes the features grow with added noise, as Inception's do."""

    resize_settings = {"by": "TinyExtractor", "size": "native (no resize)"}

    def __init__(self):
        super().__init__()
        weight = torch.randn(4, 3, 3, 3, generator=torch.Generator().manual_seed(3))
        self.register_buffer("weight", weight - weight.mean(dim=(1, 2, 3), keepdim=True))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.nn.functional.conv2d(x.float() / 255.0, self.weight, padding=1).abs()
        return torch.nn.functional.adaptive_avg_pool2d(h, 2).flatten(1)


def fast_bootstrap():
    from sagevideo.eval.stats import Bootstrap

    return Bootstrap(resamples=200, set_resamples=10)


FAST = fast_bootstrap()


def run_eval(ref, test, out, weights, noise=None, metrics=None, echo=None, **kw):
    """`evaluate` with the tiny extractor and small bootstrap/KID settings."""
    from sagevideo.eval.evaluate import EvalOptions, evaluate

    options = EvalOptions(
        metrics=metrics,
        weights=weights,
        fid_extractor=TinyExtractor(),
        bootstrap=FAST,
        kid_subsets=20,
        kid_bootstrap_subsets=5,
        **kw,
    )
    return evaluate(ref, test, out=out, noise_ref=noise, options=options, echo=echo or (lambda line: None))
