"""Input images of image-to-video jobs (a job's `image:` field): read, checked and hashed before
anything loads, then read again where the job runs. No torch.

An image is a local file that PIL (or, failing that, imageio) can decode. It is known by its
content: `inspect_image` returns its SHA-256 (the full 64 hex digits, as `sha256sum` prints
them), size and format, and a job's id and manifest record carry that hash, not the path alone.
Where the job runs (this process, a Ray worker, a rank of a group) `read_image` reads the file
at the same path again, checks it is still the planned content (a file changed or removed since
planning fails the job with what happened, rather than making a video of another picture) and
decodes it to RGB uint8. Decoding is what diffusers' `load_image` does: EXIF orientation
applied, the first frame of an animation, alpha dropped (`convert("RGB")`); 16-bit images are
scaled to 8 bits rather than clipped.
"""

from __future__ import annotations

import hashlib
import io
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

# A bigger file is almost certainly not a still meant for a video model (and would be read on
# every worker for every job).
MAX_IMAGE_BYTES = 256 * 2**20
FIX = "give a PNG, JPEG or WebP file (relative paths are relative to the job file)"
UNKNOWN = "not a format it knows"


class ImageError(ValueError):
    """An input image that cannot be used; the message starts with the file's path and says what to do."""


@dataclass(frozen=True)
class ImageInfo:
    """A checked input image: its absolute path, SHA-256 (64 hex digits) of the file, decoded
    size in pixels (after EXIF orientation) and format ("PNG", "JPEG"...)."""

    path: str
    sha256: str
    width: int
    height: int
    format: str

    @property
    def size(self) -> str:
        return f"{self.width}x{self.height}"


def inspect_image(path: str | Path) -> ImageInfo:
    """Read, hash and fully decode an image file (driver side, before anything loads); ImageError
    naming the file and the fix when it is missing, unreadable or not an image."""
    path = Path(path).expanduser()
    data = _read(path)
    pixels, fmt = decode_image(data, str(path))
    return ImageInfo(str(path.resolve()), hashlib.sha256(data).hexdigest(), pixels.shape[1], pixels.shape[0], fmt)


def read_image(path: str | Path, sha256: str | None = None) -> np.ndarray:
    """The image at `path` as (H, W, 3) uint8 RGB (where the job runs). sha256: the content the job
    was planned with; ImageError when the file no longer has it."""
    path = Path(path).expanduser()
    data = _read(path, planned=sha256 is not None)
    if sha256 is not None:
        found = hashlib.sha256(data).hexdigest()
        if found != sha256:
            raise ImageError(
                f"{path} changed since the batch was planned (sha256 {found[:16]}..., planned "
                f"{sha256[:16]}...); run the command again to plan the job with the new image"
            )
    return decode_image(data, str(path))[0]


def decode_image(data: bytes, name: str) -> tuple[np.ndarray, str]:
    """((H, W, 3) uint8 RGB, format) of an image file's bytes: PIL first, then imageio."""
    try:
        return _decode_pil(data)
    except Exception as err:  # noqa: BLE001 - any decoder failure: try the other reader
        pil_error = _reason(err)
    try:
        return _decode_imageio(data)
    except Exception as err:  # noqa: BLE001
        imageio_error = _reason(err)
    why = "neither knows its format" if pil_error == imageio_error == UNKNOWN else \
        f"PIL: {pil_error}; imageio: {imageio_error}"
    raise ImageError(f"{name} is not an image PIL or imageio can read ({why}); {FIX}")


def _read(path: Path, planned: bool = False) -> bytes:
    when = " (it was there when the batch was planned)" if planned else ""
    if not path.exists():
        raise ImageError(f"{path} does not exist{when}; {FIX}")
    if not path.is_file():
        raise ImageError(f"{path} is not a file; {FIX}")
    size = path.stat().st_size
    if size > MAX_IMAGE_BYTES:
        raise ImageError(
            f"{path} is {size / 2**20:.0f} MiB, more than the {MAX_IMAGE_BYTES // 2**20} MiB an input "
            "image may be; save it smaller (it is resized to the video's resolution anyway)"
        )
    try:
        return path.read_bytes()
    except OSError as err:
        raise ImageError(f"{path} cannot be read ({err.strerror or err}){when}") from None


def _decode_pil(data: bytes) -> tuple[np.ndarray, str]:
    from PIL import Image, ImageOps

    with warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)  # refused, not read half-way
        image = Image.open(io.BytesIO(data))
        fmt = image.format or "image"
        image.load()  # the whole file: a truncated one fails here, not on a worker
    image = ImageOps.exif_transpose(image)
    if image.mode in ("I;16", "I;16L", "I;16B", "I;16N", "I"):
        return _to_rgb8(np.asarray(image)), fmt
    return np.asarray(image.convert("RGB")), fmt


def _decode_imageio(data: bytes) -> tuple[np.ndarray, str]:
    import imageio.v3 as iio

    with warnings.catch_warnings():  # its plugins' deprecation notices, when it tries each on a non-image
        warnings.simplefilter("ignore", DeprecationWarning)
        pixels = iio.imread(io.BytesIO(data), index=0)
    return _to_rgb8(np.asarray(pixels)), "image"


def _to_rgb8(pixels: np.ndarray) -> np.ndarray:
    """(H, W), (H, W, 1|2|3|4) of any integer or float type -> (H, W, 3) uint8."""
    if pixels.ndim == 2:
        pixels = pixels[..., None]
    if pixels.ndim != 3 or pixels.shape[-1] not in (1, 2, 3, 4) or min(pixels.shape[:2]) < 1:
        raise ValueError(f"an array of shape {pixels.shape}, not a still image")
    channels = pixels.shape[-1]
    if channels in (2, 4):  # drop alpha, as convert("RGB") does
        pixels = pixels[..., : channels - 1]
    if pixels.shape[-1] == 1:
        pixels = np.repeat(pixels, 3, axis=-1)
    if pixels.dtype == np.uint8:
        return np.ascontiguousarray(pixels)
    if np.issubdtype(pixels.dtype, np.floating):
        return np.round(np.clip(np.nan_to_num(pixels.astype(np.float64)), 0.0, 1.0) * 255).astype(np.uint8)
    if pixels.dtype == np.bool_:
        return pixels.astype(np.uint8) * 255
    top = 65535 if pixels.max(initial=0) > 255 else 255  # 16-bit content, or 8-bit values in a wider type
    return np.round(np.clip(pixels.astype(np.float64), 0, top) * (255 / top)).astype(np.uint8)


def _reason(err: BaseException) -> str:
    """A decoder's error in a few words (without the in-memory file's repr it tends to quote)."""
    if type(err).__name__ == "UnidentifiedImageError" or "Could not find a backend" in str(err):
        return UNKNOWN
    text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return re.sub(r"\s*<_io\.BytesIO object at 0x[0-9a-f]+>`*", "", text)[:160]


def as_pil(pixels: np.ndarray) -> Any:
    """A decoded image as a PIL RGB image."""
    from PIL import Image

    return Image.fromarray(np.ascontiguousarray(pixels, dtype=np.uint8))
