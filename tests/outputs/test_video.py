"""write_mp4: decodable H.264 files, written atomically, and never a truncated one under the final name."""

import errno
import functools
import os
import resource
import signal
import subprocess

import imageio.v2 as imageio
import numpy as np
import pytest

from sagevideo.outputs.video import VideoWriteError, count_frames, write_mp4


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


@pytest.fixture
def file_size_limit(monkeypatch):
    """The encoder (every child process started meanwhile) runs under `ulimit -f 8` (8 KiB): the
    same kernel path as a quota. It is killed by SIGXFSZ at the limit, as from a shell, unless
    the test asks for SIGXFSZ ignored (then its writes fail with EFBIG)."""
    real = subprocess.Popen

    def limit(ignore_signal: bool):
        def preexec():
            resource.setrlimit(resource.RLIMIT_FSIZE, (8192, 8192))
            if ignore_signal:
                signal.signal(signal.SIGXFSZ, signal.SIG_IGN)

        monkeypatch.setattr(subprocess, "Popen", functools.partial(real, preexec_fn=preexec))

    return limit


@pytest.mark.parametrize("ignore_signal", [False, True], ids=["killed-by-SIGXFSZ", "EFBIG"])
def test_file_size_limit_is_an_error_and_leaves_final_name_untouched(tmp_path, file_size_limit, ignore_signal):
    """imageio's writer never looked at ffmpeg's exit: a video cut at the limit got its final name."""
    target = tmp_path / "v.mp4"
    target.write_bytes(b"previous")
    file_size_limit(ignore_signal)
    with pytest.raises(VideoWriteError, match=r"v\.mp4 not written: file-size limit reached \(EFBIG") as err:
        write_mp4(_frames(), target)
    assert err.value.errno == errno.EFBIG and not err.value.storage_full
    assert target.read_bytes() == b"previous"
    assert sorted(os.listdir(tmp_path)) == ["v.mp4"]  # no temporary left behind


def fake_encoder(tmp_path, monkeypatch, body: str) -> None:
    """Replace the bundled ffmpeg's encoding with a shell script (its last argument is the output
    path); reading a file back (`-f framecrc`) still runs the real ffmpeg."""
    import imageio_ffmpeg

    real = imageio_ffmpeg.get_ffmpeg_exe()
    script = tmp_path / "ffmpeg"
    reads = f'case " $* " in *" framecrc "*) exec "{real}" "$@";; esac\n'
    script.write_text(f'#!/bin/sh\n{reads}cat > /dev/null\nfor out; do :; done\n{body}\n')
    script.chmod(0o755)
    monkeypatch.setattr(imageio_ffmpeg, "get_ffmpeg_exe", lambda: str(script))


def test_encoder_that_exits_cleanly_with_a_broken_file_is_caught_by_counting_frames(tmp_path, monkeypatch):
    fake_encoder(tmp_path, monkeypatch, 'printf "not an mp4" > "$out"; exit 0')
    (tmp_path / "out").mkdir()
    with pytest.raises(VideoWriteError, match=r"v\.mp4 not written: the encoded file holds 0 of 9 frames"):
        write_mp4(_frames(), tmp_path / "out" / "v.mp4")
    assert os.listdir(tmp_path / "out") == []


@pytest.mark.parametrize(
    "body, reason, code",
    [
        ('echo "Error writing trailer: No space left on device" >&2; exit 1', "disk full \\(ENOSPC\\)", errno.ENOSPC),
        ('echo "av_interleaved_write_frame(): Disk quota exceeded" >&2; exit 1', "disk quota exceeded", errno.EDQUOT),
        ('echo "something odd" >&2; exit 3', "the encoder failed \\(exit status 3: something odd\\)", None),
    ],
)
def test_encoder_errors_are_named(tmp_path, monkeypatch, body, reason, code):
    fake_encoder(tmp_path, monkeypatch, body)
    (tmp_path / "out").mkdir()
    with pytest.raises(VideoWriteError, match=f"v\\.mp4 not written: {reason}") as err:
        write_mp4(_frames(), tmp_path / "out" / "v.mp4")
    assert err.value.errno == code and err.value.storage_full == (code in (errno.ENOSPC, errno.EDQUOT))
    assert os.listdir(tmp_path / "out") == []


_forks: list[str] = []
_watch_forks = [False]
os.register_at_fork(before=lambda: _watch_forks[0] and _forks.append("fork"))  # (hooks cannot be removed)


def test_reading_back_runs_no_fork_hooks_where_a_signal_would_be_lost(tmp_path):
    """imageio's reader started ffmpeg with a Python preexec_fn: CPython then runs its fork hooks
    in this process and discards what a signal handler raises inside them ("Exception ignored in
    _releaseLock"). A SIGTERM landing there was lost: 7 of 40 runs signalled during the read-back
    rendered to the end. The read-back now starts ffmpeg as the encoder does, without them."""
    path = write_mp4(_frames(), tmp_path / "v.mp4")
    _watch_forks[0] = True
    try:
        assert count_frames(path) == 9
    finally:
        _watch_forks[0] = False
    assert _forks == []


def test_a_decoder_that_cannot_start_is_named_not_counted_as_zero_frames(tmp_path, monkeypatch):
    def no_process(*args, **kwargs):
        raise BlockingIOError(errno.EAGAIN, "Resource temporarily unavailable")

    real_popen = subprocess.Popen

    def popen(cmd, **kwargs):  # the encoder starts; the decoder that reads its file back cannot
        return (no_process if "framecrc" in cmd else real_popen)(cmd, **kwargs)

    monkeypatch.setattr(subprocess, "Popen", popen)
    with pytest.raises(VideoWriteError, match=r"^v\.mp4 not written: it could not be read back \(Resource tempo"):
        write_mp4(_frames(), tmp_path / "v.mp4")
    assert os.listdir(tmp_path) == []


def test_a_signal_while_the_encoder_starts_stops_it_and_leaves_nothing(tmp_path, monkeypatch, stop_signals_delivered):
    """Ctrl-C (or SIGTERM, with the batch's handler) landing inside Popen, after the child started:
    before, the KeyboardInterrupt came out of Popen without the process, and the encoder ran on,
    unseen, writing its partial file after the run's clean-up."""
    import imageio_ffmpeg

    imageio_ffmpeg.get_ffmpeg_exe()  # its first call in a process runs `ffmpeg -version`: not the encoder
    real_popen, started = subprocess.Popen, []

    def popen_then_signal(*args, **kwargs):
        process = real_popen(*args, **kwargs)
        started.append(process)
        os.kill(os.getpid(), signal.SIGINT)  # the handler runs at the next bytecode, still inside "Popen"
        return process

    monkeypatch.setattr(subprocess, "Popen", popen_then_signal)
    with pytest.raises(KeyboardInterrupt):
        write_mp4(_frames(), tmp_path / "v.mp4")
        pytest.fail(f"no KeyboardInterrupt; SIGINT at the test's start: {stop_signals_delivered}")
    assert len(started) == 1 and started[0].poll() is not None  # the encoder was stopped, not left running
    assert os.listdir(tmp_path) == []


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


def test_read_frames_gives_back_every_frame_as_rgb(tmp_path):
    from sagevideo.outputs import video

    path = write_mp4(_frames(), tmp_path / "v.mp4", fps=8)
    frames = video.read_frames(path)
    assert frames.shape == (9, 64, 48, 3) and frames.dtype == np.uint8


def test_read_frames_says_in_one_line_why_a_file_does_not_decode(tmp_path):
    from sagevideo.outputs import video

    path = write_mp4(_frames(), tmp_path / "v.mp4", fps=8)
    cut = tmp_path / "cut.mp4"
    cut.write_bytes(path.read_bytes()[: path.stat().st_size // 3])
    with pytest.raises(video.VideoReadError) as caught:
        video.read_frames(cut)
    message = str(caught.value)
    assert message.startswith("cut.mp4 cannot be decoded (") and "\n" not in message
    assert "ffmpeg version" not in message and message.endswith("Render or copy it again")
