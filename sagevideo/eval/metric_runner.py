"""One pass over the paired videos: each (prompt, seed) read once and fed to every metric that can
run (PSNR/SSIM/LPIPS of test and noise against ref, CLIPSIM/CLIP-T of each arm, FID/KID features),
with a difference video written per pair."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from sagevideo.eval.pairing import Pair
from sagevideo.eval.results import describe_write_error
from sagevideo.eval.weights import CLIP_FOLDER, INCEPTION_FILE, LPIPS_FILES, check, status_for, torch_load_reason


class MetricRunner:
    """The metric objects of one evaluation and what they collect: the metrics that can run (the
    others in `skipped`, with `failed` those whose weights are present but do not load), their
    models, the difference videos written (`not_written`: those that could not be)."""

    def __init__(self, keys: list[str], options: Any, echo: Callable[[str], None]):
        self.options = options
        self.echo = echo
        self.skipped: dict[str, str] = {}
        self.failed: dict[str, str] = {}  # skipped because their weights are present but cannot be loaded
        self.not_written: dict[str, str] = {}  # file (relative to --out) -> why it could not be written
        self.storage_full: str | None = None  # the reason, once a write found the disk or quota full
        self.details: dict[str, dict[str, Any]] = {}
        weights_dir = Path(options.weights).expanduser() if options.weights is not None else None
        statuses = check(weights_dir, lpips_net=options.lpips_net)
        root = weights_dir if weights_dir is not None else _default_root()
        self.keys = []
        for key in keys:
            status = status_for(key, statuses)
            injected = (key in ("clipsim", "clip_t") and options.clip is not None) or (
                key in ("fid", "kid") and options.fid_extractor is not None
            )
            if status is not None and not status.ok and not injected:
                line = status.skip_line(root)
                if line not in self.skipped.values():
                    echo(f"sagevideo eval: {line}")
                self.skipped[key] = line
                if status.broken:
                    self.failed[key] = line
                continue
            self.keys.append(key)
        self.root = root
        self.clip = self.lpips = self.features = None
        # One metric's broken model must not lose the others: each group loads on its own.
        for group, load in (
            (("clipsim", "clip_t"), self._load_clip), (("lpips",), self._load_lpips), (("fid", "kid"), self._load_fid)
        ):
            if not set(group) & set(self.keys):
                continue
            try:
                load()
            except Exception as err:  # corrupt, truncated or of another model
                names = "/".join(k for k in group if k in self.keys)
                line = f"{names}: skipped, its model could not be loaded from {root} ({torch_load_reason(err)})"
                echo(f"sagevideo eval: {line}")
                for key in group:
                    if key in self.keys:
                        self.keys.remove(key)
                        self.skipped[key] = self.failed[key] = line

    def _load_clip(self) -> None:
        from sagevideo.eval.clip_metrics import CLIPEmbedder, load_clip

        o = self.options
        if isinstance(o.clip, CLIPEmbedder):
            self.clip = o.clip
        elif o.clip is not None:
            model, processor = o.clip
            self.clip = CLIPEmbedder(model, processor, device=o.device)
        else:
            self.clip = load_clip(self.root / CLIP_FOLDER, device=o.device)
        self.details["clip"] = self.clip.describe()

    def _load_lpips(self) -> None:
        from sagevideo.eval.lpips import LocalLPIPS

        o = self.options
        path = self.root / "lpips" / LPIPS_FILES[o.lpips_net]
        self.lpips = LocalLPIPS(path, o.lpips_net).to(o.device)
        self.details["lpips"] = {
            "net": o.lpips_net,
            "backbone_file": str(path),
            "linear_layers": "torchmetrics' lpips_models",
            "input": "frames in [-1, 1]",
        }

    def _load_fid(self) -> None:
        from sagevideo.eval import fid

        o = self.options
        if o.fid_extractor is not None:
            self.features = fid.injected_features(o.fid_extractor, resize=o.fid_resize, device=o.device)
        else:
            self.features = fid.inception_features(
                self.root / "inception" / INCEPTION_FILE, antialias=o.fid_antialias, device=o.device
            )
        self.details["fid"] = self.features.describe()

    def run(self, pairs: list[Pair], out: Path, progress: Callable[[str], None] | None) -> dict[str, Any]:
        import torch

        with torch.inference_mode():  # metric models only infer; grad mode stays as the caller set it
            return self._run(pairs, out, progress)

    def _run(self, pairs: list[Pair], out: Path, progress: Callable[[str], None] | None) -> dict[str, Any]:
        from sagevideo.eval.frame_metrics import to_tensor
        from sagevideo.outputs.video import read_frames

        arms = ["ref", "test"] + (["noise"] if pairs[0].noise is not None else [])
        paired, per_arm = self._metrics(arms)
        features: dict[str, list[Any]] = {a: [] for a in arms}
        diff_dir = out / "videos"
        try:
            diff_dir.mkdir(exist_ok=True)
        except OSError as err:
            self.storage_full = f"{diff_dir}: {describe_write_error(err)}"
        diff_videos: list[str | None] = []
        for index, pair in enumerate(pairs):
            if progress is not None:
                progress(f"video {index + 1}/{len(pairs)}: {pair.ref.label}")
            frames = {arm: getattr(pair, arm).take_frames(read_frames) for arm in arms}
            tensors = {a: to_tensor(f) for a, f in frames.items()}
            for metric in paired.values():
                for role, m in metric.items():
                    m.update(tensors["ref"], tensors[role])
            for arm in arms:  # arm-major: CLIPSIM and CLIP-T share the arm's frame embeddings
                for key, metric in per_arm.items():
                    if key == "clipsim":
                        metric[arm].update(frames[arm], pair.prompt)
                    else:
                        metric[arm].update(frames[arm])
                if self.features is not None:
                    features[arm].append(self.features(frames[arm]))
            fps = int(pair.ref.record.fps or 8)
            diff_videos.append(self._write_diff(_difference(frames, self.options.diff_gain),
                                                diff_dir / f"{index:03d}-diff.mp4", fps))
        results = {
            # compute() of one video is a 0-dim tensor (torchmetrics squeezes single values)
            "paired": {k: {r: m.compute().reshape(-1).tolist() for r, m in v.items()} for k, v in paired.items()},
            "per_arm": {k: {a: m.compute().reshape(-1).tolist() for a, m in v.items()} for k, v in per_arm.items()},
            "features": features,
            "diff_videos": diff_videos,
        }
        if "psnr" in paired:
            results["identical_frames"] = {r: int(m.identical_frames) for r, m in paired["psnr"].items()}
        if "clipsim" in per_arm:
            results["long_prompts"] = per_arm["clipsim"]["ref"].token_reports
        return results

    def _metrics(self, arms: list[str]) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
        """(paired: metric key -> role -> metric of that role against ref, per_arm: key -> arm -> metric)
        for the metrics that run."""
        from sagevideo.eval.clip_metrics import CLIPSIM, CLIPTemporal
        from sagevideo.eval.frame_metrics import VideoPSNR, VideoSSIM
        from sagevideo.eval.lpips import VideoLPIPS

        paired_makers = {"psnr": VideoPSNR, "ssim": VideoSSIM, "lpips": lambda: VideoLPIPS(self.lpips)}
        per_arm_makers = {"clipsim": lambda: CLIPSIM(self.clip), "clip_t": lambda: CLIPTemporal(self.clip)}
        paired = {k: {r: make() for r in arms[1:]} for k, make in paired_makers.items() if k in self.keys}
        per_arm = {k: {a: make() for a in arms} for k, make in per_arm_makers.items() if k in self.keys}
        return paired, per_arm

    def _write_diff(self, frames: Any, path: Path, fps: int) -> str | None:
        """Write one difference video (F, H, W, 3 uint8): its link relative to --out, or None with
        the reason in `not_written`. Once the disk or quota is full the rest are not tried (each
        would fail the same way after its encode); the metrics go on."""
        from sagevideo.outputs.video import STORAGE_FULL, VideoWriteError, write_mp4

        link = f"videos/{path.name}"
        if self.storage_full is not None:
            self.not_written[link] = self.storage_full
            return None
        try:
            write_mp4(frames, path, fps=fps, quality=9)
        except (VideoWriteError, OSError) as err:
            reason = describe_write_error(err)
            self.not_written[link] = reason
            if getattr(err, "errno", None) in STORAGE_FULL:
                self.storage_full = reason
            return None
        return link


def _difference(frames: dict[str, Any], gain: float) -> Any:
    """|test − ref| × gain as (F, H, W, 3) uint8: what a pair's difference video shows."""
    import numpy as np

    diff = np.abs(frames["test"].astype(np.float32) - frames["ref"].astype(np.float32)) * gain
    return np.clip(diff, 0, 255).astype(np.uint8)


def _default_root() -> Path:
    from sagevideo.eval.weights import default_weights_dir

    return default_weights_dir()
