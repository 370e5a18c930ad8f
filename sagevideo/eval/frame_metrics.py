"""PSNR and SSIM between paired videos: per frame (torchmetrics), averaged per video.

Frames are RGB in [0, 1] (uint8 / 255) with the data range fixed at 1.0, never estimated from
the frames. SSIM is torchmetrics' (11×11 Gaussian window, σ 1.5, averaged over channels).
A frame identical in both videos has PSNR +inf: identical frames are counted and left out of
the video's mean, and a video whose frames are all identical has PSNR +inf.
"""

from __future__ import annotations

import torch
from torchmetrics import Metric
from torchmetrics.functional.image import peak_signal_noise_ratio, structural_similarity_index_measure
from torchmetrics.utilities import dim_zero_cat

DATA_RANGE = 1.0


def to_tensor(frames):
    """(F, H, W, 3) uint8 numpy frames -> (F, 3, H, W) float32 in [0, 1], what the metrics take."""
    import numpy as np

    return torch.from_numpy(np.ascontiguousarray(frames)).permute(0, 3, 1, 2).float().div_(255.0)


def _check(ref: torch.Tensor, test: torch.Tensor) -> None:
    if ref.shape != test.shape or ref.ndim != 4 or ref.shape[1] != 3:
        raise ValueError(
            f"expected two (F, 3, H, W) videos of one shape, got {tuple(ref.shape)} and {tuple(test.shape)}"
        )


class PerVideoMetric(Metric):
    """Collects one value per video (`compute()` returns them all, in update order): the base of every
    per-video metric (PSNR, SSIM here; LPIPS, CLIPSIM, CLIP-T); subclasses append to `values` in `update`."""

    full_state_update = False
    is_differentiable = False

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.add_state("values", default=[], dist_reduce_fx="cat")

    def compute(self) -> torch.Tensor:
        return dim_zero_cat(self.values) if self.values else torch.zeros(0, dtype=torch.float64)


class VideoPSNR(PerVideoMetric):
    """Per-video mean of per-frame PSNR (dB); identical frames counted in `identical_frames`."""

    higher_is_better = True

    def __init__(self, data_range: float = DATA_RANGE, **kwargs):
        super().__init__(**kwargs)
        self.data_range = data_range
        self.add_state("identical_frames", default=torch.tensor(0), dist_reduce_fx="sum")

    def update(self, ref: torch.Tensor, test: torch.Tensor) -> None:
        """ref, test: (F, 3, H, W) in [0, data_range]."""
        _check(ref, test)
        per_frame = peak_signal_noise_ratio(
            test.double(), ref.double(), data_range=self.data_range, reduction="none", dim=(1, 2, 3)
        )
        finite = per_frame[torch.isfinite(per_frame)]
        self.identical_frames += int(per_frame.numel() - finite.numel())
        value = finite.mean() if finite.numel() else torch.tensor(float("inf"), dtype=torch.float64)
        self.values.append(value.reshape(1).double())


class VideoSSIM(PerVideoMetric):
    """Per-video mean of per-frame SSIM (1 = identical)."""

    higher_is_better = True

    def __init__(self, data_range: float = DATA_RANGE, **kwargs):
        super().__init__(**kwargs)
        self.data_range = data_range

    def update(self, ref: torch.Tensor, test: torch.Tensor) -> None:
        """ref, test: (F, 3, H, W) in [0, data_range]."""
        _check(ref, test)
        per_frame = structural_similarity_index_measure(  # float32: ample for [0, 1] frames, 3-20x faster
            test.float(), ref.float(), data_range=self.data_range, reduction="none"
        )
        self.values.append(per_frame.double().mean().reshape(1))
