"""FID and KID between the frames of two arms (torchmetrics), with a local or injected extractor.

Frames go through the feature extractor once (uint8 RGB, (N, 3, H, W)); the features are kept
per video, so bootstrap resamples of prompts recompute FID/KID from features without running
the network again. FID/KID themselves are torchmetrics' `FrechetInceptionDistance` and
`KernelInceptionDistance`, fed the cached features through a pass-through "extractor".

The real extractor is torchmetrics' `NoTrainInceptionV3` (torch-fidelity's port of the TF FID
Inception graph) loaded from the local weights file: frames are resized inside it to 299×299
(bilinear, antialias on by default; aspect ratio not kept) and scaled to [-1, 1]; features are
the 2,048-d pool3 activations. Any `nn.Module` mapping uint8 (N, 3, H, W) to (N, d) can be
injected instead (tests use a tiny one). FID from fewer than 2,048 frames per arm is marked
unreliable (the 2,048-d covariance is rank-deficient below that); KID is mean ± std over
random subsets (torchmetrics), seeded.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

RELIABLE_SAMPLES = 2048
BATCH = 32
KID_SUBSETS = 100
KID_SUBSET_SIZE = 1000


class _Features(nn.Module):
    """Pass-through extractor: the "images" torchmetrics receives are already features."""

    def __init__(self, num_features: int):
        super().__init__()
        self.num_features = num_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


class FrameFeatures:
    """Runs an extractor over frames; `resize` records how frames reach it."""

    def __init__(self, extractor: nn.Module, *, resize: dict[str, Any], name: str, device: str | torch.device = "cpu"):
        self.extractor = extractor.eval().to(device)
        self.device = torch.device(device)
        self.resize = resize
        self.name = name

    @torch.no_grad()
    def __call__(self, frames: np.ndarray) -> torch.Tensor:
        """(F, H, W, 3) uint8 -> (F, d) float64 on CPU."""
        out = []
        for start in range(0, len(frames), BATCH):
            batch = torch.from_numpy(np.ascontiguousarray(frames[start : start + BATCH])).permute(0, 3, 1, 2)
            out.append(self.extractor(batch.to(self.device)).reshape(batch.shape[0], -1).double().cpu())
        return torch.cat(out)

    def describe(self) -> dict[str, Any]:
        return {"extractor": self.name, "input": "uint8 RGB frames (N, 3, H, W)", "resize": self.resize}


def inception_features(weights_file: str | Path, *, antialias: bool = True, device: str = "cpu") -> FrameFeatures:
    """torchmetrics' NoTrainInceptionV3 (2,048-d pool3) from a local torch-fidelity weights file."""
    import inspect

    from torchmetrics.image.fid import NoTrainInceptionV3

    kwargs = {
        "name": "inception-v3-compat",
        "features_list": ["2048"],
        "feature_extractor_weights_path": str(weights_file),
    }
    if "antialias" in inspect.signature(NoTrainInceptionV3.__init__).parameters:
        kwargs["antialias"] = antialias
    else:  # older torchmetrics: always torch-fidelity's TF1-compatible bilinear resize
        antialias = False
    net = NoTrainInceptionV3(**kwargs)
    resize = {
        "by": "torchmetrics NoTrainInceptionV3, inside the network",
        "size": [299, 299],
        "mode": "bilinear" if antialias else "bilinear, TF1-compatible (torch-fidelity)",
        "antialias": antialias,
        "aspect_ratio": "not kept (stretched to a square)",
        "scale": "(x - 128) / 128",
    }
    return FrameFeatures(net, resize=resize, name=f"Inception v3 ({Path(weights_file).name})", device=device)


def injected_features(
    extractor: nn.Module, *, resize: dict[str, Any] | None = None, device: str = "cpu"
) -> FrameFeatures:
    """A caller's extractor (uint8 (N, 3, H, W) -> (N, d)); `resize` says what it does to frame size."""
    resize = resize or getattr(extractor, "resize_settings", None) or {"by": "the injected extractor (not stated)"}
    return FrameFeatures(extractor, resize=resize, name=f"injected {type(extractor).__name__}", device=device)


def fid(ref: torch.Tensor, test: torch.Tensor) -> float:
    """FID between two feature sets (rows = frames), torchmetrics' formula; reference is "real"."""
    from torchmetrics.image.fid import FrechetInceptionDistance

    metric = FrechetInceptionDistance(feature=_Features(ref.shape[1]))
    metric.update(ref, real=True)
    metric.update(test, real=False)
    return float(metric.compute())


def kid(
    ref: torch.Tensor, test: torch.Tensor, *, subsets: int = KID_SUBSETS, subset_size: int | None = None, seed: int = 0
) -> tuple[float, float, int]:
    """(KID mean, KID std, subset size) between two feature sets (torchmetrics), seeded subsets."""
    from torchmetrics.image.kid import KernelInceptionDistance

    size = subset_size or min(KID_SUBSET_SIZE, ref.shape[0], test.shape[0])
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*will save all extracted features.*")
        metric = KernelInceptionDistance(feature=_Features(ref.shape[1]), subsets=subsets, subset_size=size)
    metric.update(ref, real=True)
    metric.update(test, real=False)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        mean, std = metric.compute()
    return float(mean), float(std), size


def reliability(n_frames: int) -> dict[str, Any]:
    """{"samples", "reliable", "note"} for FID computed from n_frames frames per arm."""
    reliable = n_frames >= RELIABLE_SAMPLES
    note = (
        ""
        if reliable
        else (
            f"unreliable: {n_frames} frames per arm, fewer than {RELIABLE_SAMPLES} (FID is biased upward and "
            "noisy on small sets; compare it only with the noise floor of the same size)"
        )
    )
    return {"samples": n_frames, "reliable": reliable, "note": note}
