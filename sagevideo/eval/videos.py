"""Reading videos for evaluation (imageio + its bundled ffmpeg).

imageio's ffmpeg reader reports its length as sys.maxsize, so `list(reader)` raises
MemoryError: frames are read by iterating the reader.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


def read_frames(path: str | Path) -> np.ndarray:
    """All frames of a video as (F, H, W, 3) uint8 RGB."""
    import imageio.v2 as imageio

    frames = []
    with imageio.get_reader(str(path), format="FFMPEG") as reader:
        for frame in reader:
            frames.append(np.asarray(frame)[..., :3])
    if not frames:
        raise ValueError(f"{path}: no frames could be decoded")
    return np.stack(frames)


def to_tensor(frames: np.ndarray):
    """(F, H, W, 3) uint8 -> (F, 3, H, W) float32 in [0, 1]."""
    import torch

    return torch.from_numpy(np.ascontiguousarray(frames)).permute(0, 3, 1, 2).float().div_(255.0)
