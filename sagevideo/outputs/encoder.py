"""Is there a video encoder here? Asked before any model loads by every command that writes or
reads mp4 files (generate, ab and torchrun through `plan_batch`, eval), so a missing encoder is
one line at the start, not a failure after each job's whole render.

The encoder is the ffmpeg `video.write_mp4` runs: `IMAGEIO_FFMPEG_EXE` when set, else the binary
that imageio-ffmpeg bundles (then conda's or the system's ffmpeg, as imageio-ffmpeg looks for
them). It must start and list libx264, the H.264 encoder the videos are written with.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

ENV = "IMAGEIO_FFMPEG_EXE"
H264 = "libx264"
ANSWER_S = 30  # `ffmpeg -encoders` answers in milliseconds; a hang is its own problem
_USE_BUNDLED = (f"reinstall imageio-ffmpeg (pip install --force-reinstall imageio-ffmpeg), or set {ENV} to an "
                "ffmpeg binary")


def encoder_problem() -> str | None:
    """Why no video can be written or read here (one line naming the fix), or None when ffmpeg
    runs and has libx264."""
    try:
        import imageio_ffmpeg
    except ImportError:
        return "no video encoder: imageio-ffmpeg is not installed; pip install imageio-ffmpeg"
    given = os.environ.get(ENV)
    if given:
        exe = shutil.which(given)  # a path, or a bare name looked up on PATH; None unless executable
        if exe is None:
            fix = f"set {ENV} to an ffmpeg binary, or unset it to use imageio-ffmpeg's own"
            return f"{ENV}={given}: {_not_runnable(given)}, so no video can be written; {fix}"
        where = f"{ENV}={given}"
    else:
        try:
            exe = imageio_ffmpeg.get_ffmpeg_exe()
        except RuntimeError:  # the bundled binary is missing or does not run, and no other ffmpeg was found
            return f"no video encoder: imageio-ffmpeg's ffmpeg {_bundled_state(imageio_ffmpeg)}; {_USE_BUNDLED}"
        where = f"the video encoder {exe}"
    return _run_problem(exe, where, given)


def _run_problem(exe: str, where: str, given: str | None) -> str | None:
    """Why `exe` cannot encode H.264 (it does not start, fails, or lacks libx264), or None."""
    fix = f"set {ENV} to an ffmpeg binary, or unset it to use imageio-ffmpeg's own" if given else _USE_BUNDLED
    try:
        done = subprocess.run([exe, "-hide_banner", "-encoders"], capture_output=True, timeout=ANSWER_S, check=False,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return f"{where}: did not answer `-encoders` in {ANSWER_S} s, so no video can be written; {fix}"
    except OSError as err:  # e.g. ENOEXEC: a script without #! or a binary for another machine
        return f"{where}: cannot be run ({err.strerror or err}), so no video can be written; {fix}"
    if done.returncode != 0:
        last = (done.stderr.decode("utf-8", errors="replace").strip().splitlines() or [""])[-1][:200]
        said = f": {last}" if last else ""
        return f"{where}: exits with status {done.returncode} when asked for its encoders{said}; {fix}"
    if H264.encode() not in done.stdout:
        return (f"{where}: lists no {H264} encoder (H.264, which sagevideo writes), so no video can be written; "
                f"use an ffmpeg built with {H264}: {fix}")
    return None


def _not_runnable(given: str) -> str:
    """What is wrong with a path (or a bare name, looked up on PATH) that `shutil.which` did not take."""
    path = Path(given)
    if not path.exists():
        return "no such file" if os.sep in given else "not found on PATH"
    if path.is_dir():
        return "is a folder"
    return f"is not executable (chmod +x {path})"


def _bundled_state(imageio_ffmpeg) -> str:
    """'binary is missing (PATH)' or 'is not executable (PATH)' for imageio-ffmpeg's own ffmpeg."""
    try:
        from imageio_ffmpeg._definitions import FNAME_PER_PLATFORM, get_platform
        from imageio_ffmpeg._utils import _get_bin_dir

        path = Path(_get_bin_dir()) / FNAME_PER_PLATFORM.get(get_platform(), "")
    except Exception:  # private helpers of imageio-ffmpeg: only the wording depends on them
        return "binary was not found"
    if not path.is_file():
        return f"binary is missing ({path})"
    if not os.access(path, os.X_OK):
        return f"binary is not executable ({path}: chmod +x it)"
    return f"binary does not run ({path})"
