"""Write mp4 files so that no half-written video ever has its final name.

The video is encoded (imageio + its bundled ffmpeg; H.264, yuv420p) into a hidden temporary
file in the destination folder, fsynced, then renamed over the final name with `os.replace`,
which is atomic within one filesystem.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path

import numpy as np

# H.264 with yuv420p needs even sizes; 16 keeps every encoder and player happy. Generation sizes
# are checked to be multiples of 16 up front, so imageio never has to resize.
MACRO_BLOCK = 16


def write_mp4(frames: np.ndarray, path: str | Path, *, fps: int = 8, quality: float = 8.0) -> Path:
    """Encode frames (F, H, W, 3) uint8 RGB to `path` atomically; returns the path.

    quality: imageio's 0-10 scale (10 = best). Raises ValueError for bad frames; on any error
    the temporary file is removed and `path` is untouched.
    """
    import imageio.v2 as imageio

    frames = _checked_frames(frames, "write_mp4")
    path = Path(path)
    # Hidden, unique, same folder (so the rename stays on one filesystem); ffmpeg creates it with
    # the usual umask permissions (mkstemp's would be 0600).
    tmp = path.with_name(f".{path.stem}.{os.getpid()}-{secrets.token_hex(4)}.partial.mp4")
    try:
        writer = imageio.get_writer(
            tmp,
            format="FFMPEG",
            mode="I",
            fps=fps,
            codec="libx264",
            pixelformat="yuv420p",
            quality=quality,
            macro_block_size=MACRO_BLOCK,
            ffmpeg_log_level="error",
        )
        with writer:
            for frame in frames:
                writer.append_data(frame)
        _fsync_file(tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)
    return path


def write_frames_png(frames: np.ndarray, folder: str | Path) -> Path:
    """Write frames (F, H, W, 3) uint8 RGB as `folder/frame_00000.png`, ... into a new folder.

    The folder is meant to be a staged (hidden) name that is renamed into place afterwards, so it
    must not exist yet; each file is fsynced. Returns the folder."""
    import imageio.v3 as iio

    frames = _checked_frames(frames, "write_frames_png")
    folder = Path(folder)
    folder.mkdir()
    for index, frame in enumerate(frames):
        path = folder / f"frame_{index:05d}.png"
        iio.imwrite(path, frame, extension=".png")
        _fsync_file(path)
    _fsync_dir(folder)
    return folder


def _checked_frames(frames: np.ndarray, who: str) -> np.ndarray:
    """frames as an array, or ValueError unless they are uint8 (F, H, W, 3) with F >= 1."""
    frames = np.asarray(frames)
    if frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[-1] != 3 or frames.shape[0] == 0:
        raise ValueError(f"{who}: frames must be uint8 (F, H, W, 3) with F >= 1, got {frames.dtype} {frames.shape}")
    return frames


def _fsync_file(path: str | Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def _fsync_dir(folder: Path) -> None:
    """Make the rename durable; not all platforms allow opening a folder, so best effort."""
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
