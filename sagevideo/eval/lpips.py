"""LPIPS between paired videos, per frame, averaged per video; backbone from a local file.

LPIPS = Σ_layers mean_xy( w_l · (unit-normalised f_l(ref) − unit-normalised f_l(test))² ), with
the ImageNet backbone's activations f_l and LPIPS's learned linear weights w_l. The formula
pieces (input scaling, channel normalisation, 1×1 linear layers) and the linear weights
(`lpips_models/{alex,vgg}.pth`, shipped inside the package) are torchmetrics'. The backbone
layers are built here with torchvision's module layout and loaded from torchvision's weight file
in the weights folder: torchmetrics builds them through torchvision, which always wants to fetch
the file itself, and which has no CPU wheel for our CPU-only torch on PyPI (its wheels link CUDA).
"""

from __future__ import annotations

import inspect
from pathlib import Path

import torch
from torch import nn

from sagevideo.eval.frame_metrics import PerVideoMetric

BATCH = 16

# (channels, LPIPS slice boundaries over torchvision's `features` indices)
_NETS = {
    "alex": ([64, 192, 384, 256, 256], [0, 2, 5, 8, 10, 12]),
    "vgg": ([64, 128, 256, 512, 512], [0, 4, 9, 16, 23, 30]),
}


def backbone_features(net: str) -> nn.Sequential:
    """torchvision's `alexnet().features` / `vgg16().features`, same indices (random init)."""
    if net == "alex":
        layers = [
            nn.Conv2d(3, 64, kernel_size=11, stride=4, padding=2),
            nn.ReLU(),
            nn.MaxPool2d(kernel_size=3, stride=2),
            nn.Conv2d(64, 192, kernel_size=5, padding=2),
            nn.ReLU(),
            nn.MaxPool2d(kernel_size=3, stride=2),
            nn.Conv2d(192, 384, kernel_size=3, padding=1),
            nn.ReLU(),
            nn.Conv2d(384, 256, kernel_size=3, padding=1),
            nn.ReLU(),
            nn.Conv2d(256, 256, kernel_size=3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(kernel_size=3, stride=2),
        ]
    elif net == "vgg":
        layers, channels = [], 3
        for v in (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"):
            if v == "M":
                layers.append(nn.MaxPool2d(kernel_size=2, stride=2))
            else:
                layers += [nn.Conv2d(channels, v, kernel_size=3, padding=1), nn.ReLU()]
                channels = v
    else:
        raise ValueError(f"lpips net {net!r}: use 'alex' or 'vgg'")
    return nn.Sequential(*layers)


class LocalLPIPS(nn.Module):
    """LPIPS with the backbone read from `backbone_file` (torchvision's state dict; only
    `features.*` is used). forward(a, b): images in [-1, 1], (N, 3, H, W) -> (N,) distances."""

    def __init__(self, backbone_file: str | Path, net: str = "alex"):
        super().__init__()
        from torchmetrics.functional.image import lpips as tm_lpips

        self.net_type = net
        chns, bounds = _NETS[net]
        features = backbone_features(net)
        state = torch.load(backbone_file, map_location="cpu", weights_only=True)
        state = state.get("state_dict", state) if isinstance(state, dict) else state
        wanted = {k.removeprefix("features."): v for k, v in state.items() if k.startswith("features.")}
        missing, unexpected = features.load_state_dict(wanted, strict=False)
        if missing or unexpected or not wanted:
            raise ValueError(
                f"{backbone_file}: not torchvision {'AlexNet' if net == 'alex' else 'VGG16'} weights "
                f"(missing {missing[:3]}, unexpected {unexpected[:3]})"
            )
        self.slices = nn.ModuleList(features[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True))
        self.scaling = tm_lpips.ScalingLayer()
        self.lins = nn.ModuleList(tm_lpips.NetLinLayer(c, use_dropout=True) for c in chns)
        lin_file = Path(inspect.getfile(tm_lpips)).parent / "lpips_models" / f"{net}.pth"
        lin_state = torch.load(lin_file, map_location="cpu", weights_only=True)
        self.lins.load_state_dict({k.removeprefix("lin"): v for k, v in lin_state.items()})
        self._normalize = tm_lpips._normalize_tensor
        self._average = tm_lpips._spatial_average
        self.requires_grad_(False)
        self.eval()

    def train(self, mode: bool = True) -> LocalLPIPS:  # never leaves eval mode (dropout off)
        return super().train(False)

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        x, y = self.scaling(a), self.scaling(b)
        total = 0.0
        for block, lin in zip(self.slices, self.lins, strict=True):
            x, y = block(x), block(y)
            diff = (self._normalize(x) - self._normalize(y)) ** 2
            total = total + self._average(lin(diff), keep_dim=True)
        return total.reshape(a.shape[0])


class VideoLPIPS(PerVideoMetric):
    """Per-video mean of per-frame LPIPS (0 = identical; lower is closer)."""

    higher_is_better = False

    def __init__(self, network: LocalLPIPS, **kwargs):
        super().__init__(**kwargs)
        self.network = network

    @torch.no_grad()
    def update(self, ref: torch.Tensor, test: torch.Tensor) -> None:
        """ref, test: (F, 3, H, W) in [0, 1]."""
        if ref.shape != test.shape:
            raise ValueError(f"shapes differ: {tuple(ref.shape)} vs {tuple(test.shape)}")
        device = next(self.network.parameters()).device
        per_frame = []
        for start in range(0, ref.shape[0], BATCH):
            a = ref[start : start + BATCH].to(device) * 2 - 1
            b = test[start : start + BATCH].to(device) * 2 - 1
            per_frame.append(self.network(a, b).double().cpu())
        self.values.append(torch.cat(per_frame).mean().reshape(1))
