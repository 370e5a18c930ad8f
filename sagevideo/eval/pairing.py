"""Pair the videos of two output folders through their manifests, by (prompt, seed, input image).

An arm is a `sagevideo generate` output folder: `manifest.jsonl` plus videos. Its finished
videos are the latest record of each job id with status "done" and its files present. Two arms
pair when every (prompt, seed, input image) appears exactly once in each (the image by its
content's SHA-256; None for text-to-video jobs), with the same frame count and
size (read from the video files themselves). Anything else is refused with every problem listed
(`PairingError`), before any model is loaded.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sagevideo.errors import PairingError
from sagevideo.outputs.manifest import MANIFEST_NAME, Manifest, ManifestRecord, as_record, is_done

# Decoded frames kept from the pairing check for the metric pass, up to this many bytes in all
# (small runs decode each video once; larger ones decode again when the metrics need them).
FRAME_CACHE_BYTES = 256 * 2**20

# Settings that should match between arms of one comparison (attention, pv, backend and plan are
# what an A/B changes); a difference is reported as a note, not refused.
COMPARED_SETTINGS = ("model_fingerprint", "steps", "guidance", "negative_prompt", "fps", "dtype")


@dataclass
class Video:
    """One finished video of an arm."""

    prompt: str
    seed: int
    path: Path
    record: ManifestRecord
    frames: int = 0
    height: int = 0
    width: int = 0
    cached: Any = None  # decoded frames kept by the pairing check (see FRAME_CACHE_BYTES)
    image: str | None = None  # the input image's SHA-256 (image-to-video jobs)

    def take_frames(self, read: Any) -> Any:
        """The decoded frames (cached ones once, then released), else `read(path)`."""
        frames, self.cached = self.cached, None
        return frames if frames is not None else read(self.path)

    @property
    def key(self) -> tuple[str, int, str | None]:
        return (self.prompt, self.seed, self.image)

    @property
    def label(self) -> str:
        return describe(self.key)


@dataclass
class Arm:
    """A folder of finished videos, keyed by (prompt, seed, image SHA-256 or None)."""

    folder: Path
    videos: dict[tuple[str, int, str | None], Video]
    records: list[ManifestRecord] = field(default_factory=list)


@dataclass
class Pair:
    """Reference and test (and optionally noise-floor) videos of one (prompt, seed)."""

    ref: Video
    test: Video
    noise: Video | None = None

    @property
    def prompt(self) -> str:
        return self.ref.prompt

    @property
    def seed(self) -> int:
        return self.ref.seed


def describe(key: tuple) -> str:
    prompt, seed, *image = key
    short = prompt if len(prompt) <= 60 else prompt[:57] + "..."
    shown = f" image {image[0][:12]}" if image and image[0] else ""
    return f"{short!r} seed {seed}{shown}"


def video_file(record: ManifestRecord | Any) -> str | None:
    """The record's video output (its first .mp4), relative to the folder."""
    return as_record(record).video


def load_arm(folder: str | Path, role: str, records: list[ManifestRecord] | None = None) -> Arm:
    """Finished videos of `folder` (from its manifest, or from `records` when given).

    role names the folder in messages ("REF_DIR", "TEST_DIR"...). Raises PairingError for a
    missing folder or manifest, no finished video, or two finished videos of one (prompt, seed, image).
    """
    folder = Path(folder).expanduser()
    if not folder.is_dir():
        raise PairingError(f"{role} {folder}: no such folder")
    if records is None:
        if not (folder / MANIFEST_NAME).is_file():
            raise PairingError(
                f"{role} {folder}: no {MANIFEST_NAME} (not a `sagevideo generate` output folder); "
                "videos are paired through their manifest records (prompt + seed)"
            )
        latest = Manifest(folder / MANIFEST_NAME).latest()
        records = list(latest.values())
    done = [r for r in map(as_record, records) if is_done(r, folder) and r.video]
    if not done:
        raise PairingError(f"{role} {folder}: the manifest records no finished video with its file present")
    videos: dict[tuple[str, int, str | None], Video] = {}
    problems = []
    for record in done:
        key = (str(record.prompt), int(record.seed or 0), record.image_sha256)
        if key in videos:
            problems.append(
                f"{role}: two finished videos for {describe(key)} (job ids {videos[key].record.job_id} and "
                f"{record.job_id}, e.g. different settings); keep one per prompt and seed, or evaluate "
                "them from separate folders"
            )
            continue
        videos[key] = Video(key[0], key[1], folder / record.video, record, image=key[2])
    if problems:
        raise PairingError("\n".join(problems))
    return Arm(folder, videos, done)


def _read_shapes(arm: Arm, role: str, budget: list[int]) -> list[str]:
    """Frame count and size of every video, decoded; frames are kept while `budget[0]` bytes last."""
    from sagevideo.outputs.video import VideoReadError, read_frames

    problems = []
    for video in arm.videos.values():
        try:
            frames = read_frames(video.path)
        except VideoReadError as err:  # truncated or not a video: one line, without ffmpeg's banner
            problems.append(f"{role}: {video.label}: {err}")
            continue
        except Exception as err:  # unreadable or truncated file
            problems.append(f"{role}: {video.label}: {video.path.name} cannot be read ({type(err).__name__}: {err})")
            continue
        video.frames, video.height, video.width = int(frames.shape[0]), int(frames.shape[1]), int(frames.shape[2])
        if frames.nbytes <= budget[0]:
            budget[0] -= frames.nbytes
            video.cached = frames
    return problems


def pair_arms(
    ref: Arm, test: Arm, noise: Arm | None = None, roles=("REF_DIR", "TEST_DIR", "--noise-ref")
) -> list[Pair]:
    """Pairs in the reference's manifest order; PairingError lists every mismatch."""
    budget = [FRAME_CACHE_BYTES]
    problems = _read_shapes(ref, roles[0], budget) + _read_shapes(test, roles[1], budget)
    if noise is not None:
        problems += _read_shapes(noise, roles[2], budget)
    for other, role in ((test, roles[1]), (noise, roles[2])):
        if other is None:
            continue
        missing = [k for k in ref.videos if k not in other.videos]
        extra = [k for k in other.videos if k not in ref.videos]
        if missing:
            problems.append(
                f"{role}: {len(missing)} video(s) of {roles[0]} have no partner (same prompt, seed and image): "
                + "; ".join(describe(k) for k in missing[:5])
                + (" ..." if len(missing) > 5 else "")
            )
        if extra:
            problems.append(
                f"{role}: {len(extra)} video(s) are not in {roles[0]}: "
                + "; ".join(describe(k) for k in extra[:5])
                + (" ..." if len(extra) > 5 else "")
            )
        for key, a in ref.videos.items():
            b = other.videos.get(key)
            if b is None or not a.frames or not b.frames:
                continue
            if a.frames != b.frames:
                problems.append(f"{role}: {a.label}: {b.frames} frames, {roles[0]} has {a.frames}")
            if (a.height, a.width) != (b.height, b.width):
                problems.append(f"{role}: {a.label}: {b.width}x{b.height} px, {roles[0]} has {a.width}x{a.height}")
    if problems:
        raise PairingError(
            "the folders do not pair:\n"
            + "\n".join(f"  {p}" for p in problems)
            + "\nboth arms must hold the same prompts and seeds, with equal frame counts and sizes"
        )
    return [
        Pair(ref=v, test=test.videos[k], noise=None if noise is None else noise.videos[k])
        for k, v in ref.videos.items()
    ]


def setting_notes(pairs: list[Pair]) -> list[str]:
    """Notes for settings that differ between paired records (besides the attention under test)."""
    notes = []
    for name in COMPARED_SETTINGS:
        for pair in pairs:
            values = {
                role: getattr(v.record, name)
                for role, v in (("ref", pair.ref), ("test", pair.test), ("noise", pair.noise))
                if v
            }
            if len({repr(x) for x in values.values()}) > 1:
                shown = ", ".join(f"{role} {value!r}" for role, value in values.items())
                notes.append(f"arms differ in {name} ({shown}, first at {pair.ref.label}): not a clean A/B")
                break
    return notes
