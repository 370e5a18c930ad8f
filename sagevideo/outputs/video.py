"""Write mp4 files so that no half-written video ever has its final name.

The video is encoded (the ffmpeg that imageio-ffmpeg bundles; H.264, yuv420p) into a hidden
temporary file in the destination folder, checked, fsynced, then renamed over the final name with
`os.replace`, which is atomic within one filesystem. Checked means: ffmpeg exited cleanly and the
file decodes back to every frame (`count_frames`). A full disk, a quota or a file-size limit (`ulimit -f`) can
leave ffmpeg with a truncated file and, when it is killed by SIGXFSZ, no error message at all;
such a write raises `VideoWriteError` with the reason and leaves nothing under the final name.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import signal
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np

# H.264 with yuv420p needs even sizes; 16 keeps every encoder and player happy. Generation sizes
# are checked to be multiples of 16 up front, so the encoder never has to resize.
MACRO_BLOCK = 16

# Errors that mean the storage itself is full: every later write there fails the same way.
STORAGE_FULL = (errno.ENOSPC, errno.EDQUOT)
_REASONS = {
    errno.ENOSPC: "disk full (ENOSPC)",
    errno.EDQUOT: "disk quota exceeded (EDQUOT)",
    errno.EFBIG: "file-size limit reached (EFBIG: ulimit -f or a quota)",
}
# How ffmpeg words those errors in its messages (it exits with its own code, not the errno).
_FFMPEG_WORDS = {
    "No space left on device": errno.ENOSPC,
    "Disk quota exceeded": errno.EDQUOT,
    "File too large": errno.EFBIG,
}


class VideoWriteError(RuntimeError):
    """A video or its PNG frames could not be written whole. errno: ENOSPC, EDQUOT, EFBIG, ... or None."""

    def __init__(self, message: str, errno_: int | None = None):
        super().__init__(message)
        self.errno = errno_

    @property
    def storage_full(self) -> bool:
        """True for a full disk or quota: later writes to the same storage would fail too."""
        return self.errno in STORAGE_FULL


def describe_os_error(err: OSError) -> str:
    """A short reason for a failed write: 'disk full (ENOSPC)', ..., else the system's message."""
    return _REASONS.get(err.errno) or err.strerror or str(err)


def write_mp4(
    frames: np.ndarray, path: str | Path, *, fps: int = 8, quality: float = 8.0, name: str | None = None
) -> Path:
    """Encode frames (F, H, W, 3) uint8 RGB to `path` atomically; returns the path.

    quality: imageio's 0-10 scale (10 = best). Raises ValueError for bad frames and
    VideoWriteError when the file could not be written whole (encoder error, disk full, quota,
    file-size limit, fewer frames read back); on any error the temporary file is removed and
    `path` is untouched. name: the video's name in those errors (default: the file name; a
    staged file's caller gives the final one).
    """
    frames = _checked_frames(frames, "write_mp4")
    path = Path(path)
    name = name or path.name
    # Hidden, unique, same folder (so the rename stays on one filesystem); ffmpeg creates it with
    # the usual umask permissions (mkstemp's would be 0600).
    tmp = path.with_name(f".{path.stem}.{os.getpid()}-{secrets.token_hex(4)}.partial.mp4")
    try:
        _encode(frames, tmp, fps=fps, quality=quality, name=name)
        try:
            _fsync_file(tmp)
        except OSError as err:
            raise VideoWriteError(f"{name} not written: {describe_os_error(err)}", err.errno) from None
        try:
            found = count_frames(tmp)
        except OSError as err:  # the decoder could not start: nothing is known about the file
            raise VideoWriteError(f"{name} not written: it could not be read back ({describe_os_error(err)})",
                                  err.errno) from None
        if found != len(frames):
            raise VideoWriteError(f"{name} not written: the encoded file holds {found} of {len(frames)} frames")
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)
    return path


def count_frames(path: str | Path) -> int:
    """Frames that decode from the video at `path` (every one is decoded: ffmpeg's framecrc output
    has a line per frame); 0 when ffmpeg cannot decode it whole (truncated, no moov atom, bad data).
    Raises OSError when ffmpeg cannot be started, and whatever a signal handler raises meanwhile.

    ffmpeg is started here (`_run_ffmpeg`), not through imageio's reader: that one starts it with a
    Python preexec_fn, which makes CPython run its fork hooks in this process and discard what a
    signal handler raises inside them ("Exception ignored in ... _releaseLock"), so a SIGTERM that
    landed there was lost.
    """
    import imageio_ffmpeg

    cmd = [
        imageio_ffmpeg.get_ffmpeg_exe(), "-nostdin", "-v", "error", "-xerror",
        "-i", str(path), "-map", "0:v:0", "-f", "framecrc", "-",
    ]
    returncode, out, _ = _run_ffmpeg(cmd, None)
    if returncode != 0:  # whatever decoded before the error is not a video
        return 0
    return sum(1 for line in out.splitlines() if line and not line.startswith(b"#"))


def _run_ffmpeg(cmd: list[str], data: memoryview | None) -> tuple[int, bytes, bytes]:
    """Run ffmpeg to its end, `data` on its stdin (None: nothing): (exit status, stdout, stderr).

    Its own session: Ctrl-C or a SIGTERM to the terminal's process group must not kill it under a
    commit; an interrupt here kills it explicitly. Stop signals are held while it starts, so that
    an interrupt always finds the process to kill (`_signals_held`)."""
    process = None
    try:
        with _signals_held():
            process = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL if data is None else subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, start_new_session=True,
            )
        out, err = process.communicate(data)
    except BaseException:
        if process is not None:
            process.kill()
            process.wait()
        raise
    return process.returncode, out, err


_HELD = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name))


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """Hold Ctrl-C, SIGTERM and SIGHUP while a child process starts, then call the handlers in force
    for those that came. Raised inside Popen (the parent resumes from vfork as the child runs, before
    Popen stores its pid), an interrupt lost the child: the encoder ran on unseen and wrote its partial
    file after the run's clean-up. Main thread only; a signal Python does not handle needs nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    previous = {signum: signal.getsignal(signum) for signum in _HELD}
    previous = {signum: handler for signum, handler in previous.items() if callable(handler)}
    for signum in previous:
        signal.signal(signum, lambda signum, frame: caught.append(signum))
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    for signum in caught:
        previous[signum](signum, None)


class VideoReadError(ValueError):
    """A video file that cannot be decoded; the message is one line naming the file and why."""


# ffmpeg's banner (version, build configuration, library versions) says nothing about the file.
_BANNER = re.compile(r"^(ffmpeg version |\s+built with |\s+configuration: |\s+lib\w+\s+\d|=== stderr ===|$)")
_GENERIC = re.compile(r"^Error opening (input|output)\b")  # ffmpeg's closing lines: the cause comes before
_CONTEXT = re.compile(r"^\[[^]]*@ 0x[0-9a-f]+\]\s*")  # "[in#0 @ 0x5557f9124040] "


def read_frames(path: str | Path) -> np.ndarray:
    """All frames of a video as (F, H, W, 3) uint8 RGB; VideoReadError (one line) when it cannot be decoded.

    imageio's ffmpeg reader reports its length as sys.maxsize, so `list(reader)` raises
    MemoryError: frames are read by iterating the reader."""
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


def _encode(frames: np.ndarray, path: Path, *, fps: int, quality: float, name: str) -> None:
    """Run ffmpeg on the raw frames and check its exit. The command is the one imageio's FFMPEG
    writer builds for these options (so the files are byte-identical to what it made), but here
    ffmpeg's exit status and messages are seen, which imageio drops."""
    from fractions import Fraction

    import imageio_ffmpeg

    count, height, width, _ = frames.shape
    crf = int((1 - quality / 10.0) * 51)  # imageio's mapping of its 0-10 quality to libx264's CRF
    cmd = [
        imageio_ffmpeg.get_ffmpeg_exe(), "-y",
        "-f", "rawvideo", "-vcodec", "rawvideo", "-s", f"{width}x{height}", "-pix_fmt", "rgb24",
        "-r", str(Fraction(fps).limit_denominator()), "-i", "-", "-an",
        "-vcodec", "libx264", "-pix_fmt", "yuv420p", "-crf", str(crf),
    ]
    if width % MACRO_BLOCK or height % MACRO_BLOCK:
        up = lambda n: n + (-n) % MACRO_BLOCK
        cmd += ["-vf", f"scale={up(width)}:{up(height)}"]
    cmd += ["-v", "error", str(path)]
    returncode, _, stderr = _run_ffmpeg(cmd, memoryview(np.ascontiguousarray(frames)).cast("B"))
    if returncode != 0:
        raise _encoder_error(returncode, stderr.decode("utf-8", errors="replace"), name)


def _encoder_error(returncode: int, stderr: str, name: str) -> VideoWriteError:
    """Why ffmpeg failed, in words: disk full, quota, file-size limit, or its last message."""
    if returncode == -getattr(signal, "SIGXFSZ", 25):
        code = errno.EFBIG  # killed by the kernel at the file-size limit, before it could say so
    else:
        code = next((code for words, code in _FFMPEG_WORDS.items() if words in stderr), None)
    if code is not None:
        reason = _REASONS[code]
    else:
        lines = [line.strip() for line in stderr.splitlines() if line.strip()]
        how = f"killed by signal {-returncode}" if returncode < 0 else f"exit status {returncode}"
        reason = f"the encoder failed ({how}" + (f": {lines[-1][:200]})" if lines else ")")
    return VideoWriteError(f"{name} not written: {reason}", code)


def write_frames_png(frames: np.ndarray, folder: str | Path, *, name: str | None = None) -> Path:
    """Write frames (F, H, W, 3) uint8 RGB as `folder/frame_00000.png`, ... into a new folder.

    The folder is meant to be a staged (hidden) name that is renamed into place afterwards, so it
    must not exist yet; each file is fsynced. Returns the folder. A failed write raises
    VideoWriteError naming `name` (default: the folder's); the partial folder is left for the
    caller's clean-up of staged names."""
    import imageio.v3 as iio

    frames = _checked_frames(frames, "write_frames_png")
    folder = Path(folder)
    try:
        folder.mkdir()
        for index, frame in enumerate(frames):
            path = folder / f"frame_{index:05d}.png"
            iio.imwrite(path, frame, extension=".png")
            _fsync_file(path)
    except OSError as err:
        reason = describe_os_error(err)
        raise VideoWriteError(f"{name or folder.name}: PNG frames not written: {reason}", err.errno) from None
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
