"""The local LPIPS equals torchmetrics LPIPS with the same backbone weights."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.usefixtures("one_thread")


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
