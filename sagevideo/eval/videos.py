"""Reading videos for evaluation (imageio + its bundled ffmpeg).

imageio's ffmpeg reader reports its length as sys.maxsize, so `list(reader)` raises
MemoryError: frames are read by iterating the reader.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np


class VideoReadError(ValueError):
    """A video file that cannot be decoded; the message is one line naming the file and why."""


# ffmpeg's banner (version, build configuration, library versions) says nothing about the file.
_BANNER = re.compile(r"^(ffmpeg version |\s+built with |\s+configuration: |\s+lib\w+\s+\d|=== stderr ===|$)")
_GENERIC = re.compile(r"^Error opening (input|output)\b")  # ffmpeg's closing lines: the cause comes before
_CONTEXT = re.compile(r"^\[[^]]*@ 0x[0-9a-f]+\]\s*")  # "[in#0 @ 0x5557f9124040] "


def read_frames(path: str | Path) -> np.ndarray:
    """All frames of a video as (F, H, W, 3) uint8 RGB; VideoReadError (one line) when it cannot be decoded."""
    import imageio.v2 as imageio

    path = Path(path)
    frames = []
    try:
        with imageio.get_reader(str(path), format="FFMPEG") as reader:
            for frame in reader:
                frames.append(np.asarray(frame)[..., :3])
    except (OSError, RuntimeError, ValueError) as err:
        raise VideoReadError(
            f"{path.name} cannot be decoded ({ffmpeg_reason(str(err))}); is it truncated (an interrupted copy or "
            "write) or not a video? Render or copy it again"
        ) from None
    if not frames:
        raise VideoReadError(f"{path.name}: no frames could be decoded; render or copy it again")
    return np.stack(frames)


def ffmpeg_reason(message: str) -> str:
    """The line of an imageio/ffmpeg error that says what is wrong with the file, without the banner."""
    lines = [_CONTEXT.sub("", line).strip() for line in message.splitlines() if not _BANNER.match(line)]
    specific = [line for line in lines if line and not _GENERIC.match(line)]
    reasons = [line for line in specific if not line.startswith("Could not load meta information")]
    return (reasons or specific or ["unknown error"])[-1].rstrip(".")  # the last one before ffmpeg gives up


def to_tensor(frames: np.ndarray):
    """(F, H, W, 3) uint8 -> (F, 3, H, W) float32 in [0, 1]."""
    import torch

    return torch.from_numpy(np.ascontiguousarray(frames)).permute(0, 3, 1, 2).float().div_(255.0)
