"""Input images: read, hashed and decoded on the driver; read again and checked where the job runs."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from PIL import Image

from sagevideo.jobs import images
from sagevideo.jobs.images import ImageError, inspect_image, read_image


def picture(width=6, height=4, seed=0):
    return (np.random.default_rng(seed).random((height, width, 3)) * 255).astype(np.uint8)


def test_an_image_is_known_by_its_content(tmp_path):
    path = tmp_path / "still.png"
    Image.fromarray(picture()).save(path)
    info = inspect_image(path)
    assert info.sha256 == hashlib.sha256(path.read_bytes()).hexdigest() and len(info.sha256) == 64
    assert (info.width, info.height, info.size, info.format) == (6, 4, "6x4", "PNG")
    assert info.path == str(path.resolve())
    assert np.array_equal(read_image(path, info.sha256), picture())

    Image.fromarray(picture(seed=1)).save(path)  # changed after planning: the job refuses it
    with pytest.raises(ImageError, match=r"still.png changed since the batch was planned .*run the command again"):
        read_image(path, info.sha256)
    path.unlink()
    with pytest.raises(ImageError, match=r"still.png does not exist \(it was there when the batch was planned\)"):
        read_image(path, info.sha256)


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda p: None, r"missing.png does not exist; give a PNG, JPEG or WebP file"),
        (lambda p: p.mkdir(), r"missing.png is not a file"),
        (lambda p: p.write_text("hello"), r"missing.png is not an image PIL or imageio can read \(neither knows its "
                                          r"format\); give a PNG"),
    ],
    ids=["missing", "folder", "text"],
)
def test_what_is_not_an_image_is_said_in_one_line(tmp_path, make, message):
    path = tmp_path / "missing.png"
    make(path)
    with pytest.raises(ImageError, match=message) as err:
        inspect_image(path)
    assert "\n" not in str(err.value) and "BytesIO" not in str(err.value)


def test_a_truncated_file_is_refused_on_the_driver(tmp_path):
    path = tmp_path / "cut.png"
    Image.fromarray(picture(64, 64)).save(path)
    path.write_bytes(path.read_bytes()[:200])
    with pytest.raises(ImageError, match="cut.png is not an image PIL or imageio can read"):
        inspect_image(path)


def test_decoding_follows_diffusers_load_image(tmp_path):
    """RGB uint8 whatever the file: alpha dropped, grey spread, 16 bits scaled (not clipped), EXIF
    orientation applied (the size checked is the one shown)."""
    rgba = np.dstack([picture(), np.zeros((4, 6), np.uint8)])
    Image.fromarray(rgba, "RGBA").save(tmp_path / "rgba.png")
    assert np.array_equal(read_image(tmp_path / "rgba.png"), picture())

    grey = np.arange(24, dtype=np.uint16).reshape(4, 6) * 2000
    Image.fromarray(grey).save(tmp_path / "grey16.png")
    decoded = read_image(tmp_path / "grey16.png")
    assert decoded.shape == (4, 6, 3) and decoded.dtype == np.uint8
    assert decoded[..., 0].max() == round(46000 * 255 / 65535) and np.array_equal(decoded[..., 0], decoded[..., 2])

    rotated = Image.fromarray(picture(6, 4))
    exif = rotated.getexif()
    exif[0x0112] = 6  # orientation: rotate 90° clockwise to show
    rotated.save(tmp_path / "phone.jpg", exif=exif)
    info = inspect_image(tmp_path / "phone.jpg")
    assert (info.width, info.height, info.format) == (4, 6, "JPEG")


def test_imageio_reads_what_pil_cannot(tmp_path, monkeypatch):
    path = tmp_path / "still.png"
    Image.fromarray(picture()).save(path)

    def no_pil(data):
        raise OSError("PIL cannot")

    monkeypatch.setattr(images, "_decode_pil", no_pil)
    assert np.array_equal(read_image(path), picture())
    assert inspect_image(path).format == "image"


def test_a_huge_file_is_refused_before_it_is_read(tmp_path, monkeypatch):
    path = tmp_path / "big.png"
    Image.fromarray(picture()).save(path)
    monkeypatch.setattr(images, "MAX_IMAGE_BYTES", 10)
    with pytest.raises(ImageError, match=r"big.png is 0 MiB, more than the 0 MiB"):
        inspect_image(path)
