"""Per-frame metric classes: reset, PSNR of identical frames is inf, shapes checked."""

from __future__ import annotations

import math

import pytest
import torch

pytestmark = pytest.mark.usefixtures("one_thread")


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


def test_every_per_video_metric_shares_one_collector():
    """PSNR, SSIM, LPIPS, CLIPSIM and CLIP-T collect one value per video the same way: an empty
    metric computes an empty float64 tensor."""
    import torch

    from sagevideo.eval.clip_metrics import CLIPSIM, CLIPTemporal
    from sagevideo.eval.frame_metrics import PerVideoMetric, VideoPSNR, VideoSSIM
    from sagevideo.eval.lpips import VideoLPIPS

    assert all(issubclass(m, PerVideoMetric) for m in (VideoPSNR, VideoSSIM, VideoLPIPS, CLIPSIM, CLIPTemporal))
    empty = VideoSSIM().compute()
    assert empty.shape == (0,) and empty.dtype == torch.float64
