"""write_mp4: decodable H.264 files, written atomically."""

import os

import imageio.v2 as imageio
import numpy as np
import pytest

from sagevideo.outputs.video import write_mp4


def _frames(n=9, h=64, w=48):
    rng = np.random.default_rng(0)
    return rng.integers(0, 256, size=(n, h, w, 3), dtype=np.uint8)


def read_frames(path):
    """(frame count, (H, W)) by iterating: list(reader) raises MemoryError in imageio."""
    reader = imageio.get_reader(path)
    try:
        shapes = [frame.shape for frame in reader]
        meta = reader.get_meta_data()
    finally:
        reader.close()
    return len(shapes), shapes[0][:2], meta


def test_round_trip(tmp_path):
    path = write_mp4(_frames(), tmp_path / "v.mp4", fps=8)
    count, size, meta = read_frames(path)
    assert (count, size) == (9, (64, 48))
    assert meta["codec"] == "h264" and meta["fps"] == 8
    assert sorted(os.listdir(tmp_path)) == ["v.mp4"]  # no temporary left behind


def test_failure_leaves_final_name_untouched(tmp_path, monkeypatch):
    target = tmp_path / "v.mp4"
    target.write_bytes(b"previous")
    import imageio.v2

    real = imageio.v2.get_writer

    class Exploding:
        def __init__(self, *args, **kwargs):
            self.inner = real(*args, **kwargs)
            self.n = 0

        def append_data(self, frame):
            self.n += 1
            if self.n == 3:
                raise RuntimeError("disk full")
            self.inner.append_data(frame)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.inner.close()

    monkeypatch.setattr(imageio.v2, "get_writer", Exploding)
    with pytest.raises(RuntimeError, match="disk full"):
        write_mp4(_frames(), target)
    assert target.read_bytes() == b"previous"
    assert sorted(os.listdir(tmp_path)) == ["v.mp4"]


@pytest.mark.parametrize(
    "bad",
    [
        np.zeros((9, 16, 16, 3), np.float32),
        np.zeros((16, 16, 3), np.uint8),
        np.zeros((0, 16, 16, 3), np.uint8),
    ],
)
def test_bad_frames(tmp_path, bad):
    with pytest.raises(ValueError, match="uint8"):
        write_mp4(bad, tmp_path / "v.mp4")
    assert not os.listdir(tmp_path)
