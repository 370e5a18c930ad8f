"""Evaluate a test arm against a reference arm: metrics.json (versioned schema) and report.html.

`evaluate(ref_dir, test_dir, out=...)` pairs the folders (`pairing`), decides which metrics can
run (weights present, or models injected), then reads each (prompt, seed) once and feeds every
metric: PSNR/SSIM/LPIPS between test and reference (and noise and reference), CLIPSIM/CLIP-T on
each arm, FID/KID features of each arm's frames. Every metric gets the difference between the
arms with a bootstrap 95% CI over prompts, N, and, with a noise-floor arm (a second
full-precision run with the same seeds), the noise floor and a verdict: within the floor when
the CI of (test − floor) contains 0.

Input problems raise `EvalInputError` (or `PairingError`) before any model is loaded.

metrics.json (schema "sagevideo.eval.metrics", version 1), top level:
  schema, schema_version, created, sagevideo_version, arms{ref,test,noise}: folder, label,
  settings; pairs[]: prompt, seed, frames, height, width, videos, diff_video; n_pairs, n_prompts;
  bootstrap{}; metrics{key: entry}; skipped{key: reason}; failed{key: reason} (the skipped ones
  whose weights are present but could not be loaded); verdicts[]; attention_probe;
  notes[]; versions{}; not_written{file: reason} (files of --out that could not be written before
  metrics.json, e.g. difference videos on a full disk: their pairs' diff_video is null).
Metric entry: name, kind ("paired": a comparison of two videos; "per_arm": a value per video of
each arm; "set": a distance between the arms' frame sets), unit, higher_is_better, description,
n, n_prompts; ref/test/noise ({mean, ci95, ...}, per_arm only); difference (per_arm: test − ref;
otherwise the metric of test vs ref), noise_floor (the same for noise vs ref, or null), excess
(difference − noise_floor, paired by prompt), verdict{within_noise_floor, direction, line},
per_pair[]: {prompt, seed, difference, noise_floor, ref, test, noise}; plus metric extras.
Non-finite numbers are written as the strings "inf", "-inf", "nan".
"""

from __future__ import annotations

import json
import os
import platform
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sagevideo.errors import EvalInputError, MetricModelError, OutputsNotWritten, PairingError
from sagevideo.eval.entries import paired_entry, per_arm_entry, set_entries
from sagevideo.eval.pairing import Arm, Pair, load_arm, pair_arms, setting_notes
from sagevideo.eval.stats import Bootstrap, fmt, json_safe
from sagevideo.eval.weights import (
    CLIP_FOLDER,
    INCEPTION_FILE,
    LPIPS_FILES,
    METRICS,
    check,
    status_for,
    torch_load_reason,
)
from sagevideo.outputs.encoder import encoder_problem
from sagevideo.outputs.manifest import ManifestRecord

SCHEMA = "sagevideo.eval.metrics"
SCHEMA_VERSION = 1
DIFF_GAIN = 8.0


@dataclass
class EvalOptions:
    """What to compute and with which models.

    metrics: keys from METRICS (default all). weights: the weights folder (default
    `weights.default_weights_dir()`). clip: an injected `CLIPEmbedder` or (model, processor)
    instead of the folder's CLIP. fid_extractor: an injected nn.Module (uint8 (N, 3, H, W) ->
    (N, d)) instead of the Inception file; fid_resize: what it does to the frame size (recorded).
    lpips_net: "alex" (default) or "vgg". diff_gain: amplification of |test − ref| in the
    difference videos. labels: display names of the arms.
    """

    metrics: Sequence[str] | None = None
    weights: str | Path | None = None
    device: str = "cpu"
    lpips_net: str = "alex"
    fid_antialias: bool = True
    kid_subsets: int = 100
    kid_bootstrap_subsets: int = 10
    bootstrap: Bootstrap = field(default_factory=Bootstrap)
    diff_gain: float = DIFF_GAIN
    clip: Any = None
    fid_extractor: Any = None
    fid_resize: dict[str, Any] | None = None
    labels: dict[str, str] = field(
        default_factory=lambda: {"ref": "reference", "test": "test", "noise": "noise floor (reference repeated)"}
    )


def check_metrics(metrics: Sequence[str] | None) -> list[str]:
    """Validated metric keys (accepts 'clip-t' for clip_t, 'all'); EvalInputError for unknown ones."""
    if not metrics:
        return list(METRICS)
    keys: list[str] = []
    for item in metrics:
        for name in str(item).split(","):
            key = name.strip().lower().replace("-", "_")
            if not key:
                continue
            if key == "all":
                keys += [m for m in METRICS if m not in keys]
                continue
            if key not in METRICS:
                raise EvalInputError(f"--metrics {name.strip()!r}: unknown metric; choose from {', '.join(METRICS)}")
            if key not in keys:
                keys.append(key)
    return [m for m in METRICS if m in keys]


def prepare_out(out: str | Path) -> Path:
    from sagevideo.outputs.folders import writable_folder

    return writable_folder(out, EvalInputError)


def plan_pairs(
    ref_dir: str | Path,
    test_dir: str | Path,
    noise_ref: str | Path | None = None,
    *,
    records: dict[str, list[ManifestRecord]] | None = None,
) -> tuple[list[Pair], dict[str, Arm]]:
    """Load and pair the arms (PairingError on any mismatch); records: per role, instead of manifests."""
    records = records or {}
    arms = {
        "ref": load_arm(ref_dir, "REF_DIR", records.get("ref")),
        "test": load_arm(test_dir, "TEST_DIR", records.get("test")),
    }
    if noise_ref is not None:
        arms["noise"] = load_arm(noise_ref, "--noise-ref", records.get("noise"))
    return pair_arms(arms["ref"], arms["test"], arms.get("noise")), arms


class _Runner:
    """The metric objects of one evaluation and what they collect."""

    def __init__(self, keys: list[str], options: EvalOptions, echo: Callable[[str], None]):
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
        import numpy as np
        import torch

        from sagevideo.eval.clip_metrics import CLIPSIM, CLIPTemporal
        from sagevideo.eval.frame_metrics import VideoPSNR, VideoSSIM, to_tensor
        from sagevideo.eval.lpips import VideoLPIPS
        from sagevideo.outputs.video import read_frames

        roles = ["test"] + (["noise"] if pairs[0].noise is not None else [])
        arms = ["ref"] + roles
        paired: dict[str, dict[str, Any]] = {}
        if "psnr" in self.keys:
            paired["psnr"] = {r: VideoPSNR() for r in roles}
        if "ssim" in self.keys:
            paired["ssim"] = {r: VideoSSIM() for r in roles}
        if "lpips" in self.keys:
            paired["lpips"] = {r: VideoLPIPS(self.lpips) for r in roles}
        per_arm: dict[str, dict[str, Any]] = {}
        if "clipsim" in self.keys:
            per_arm["clipsim"] = {a: CLIPSIM(self.clip) for a in arms}
        if "clip_t" in self.keys:
            per_arm["clip_t"] = {a: CLIPTemporal(self.clip) for a in arms}
        features: dict[str, list[torch.Tensor]] = {a: [] for a in arms}
        diff_dir = out / "videos"
        try:
            diff_dir.mkdir(exist_ok=True)
        except OSError as err:
            self.storage_full = f"{diff_dir}: {describe_write_error(err)}"
        diff_videos: list[str | None] = []
        for index, pair in enumerate(pairs):
            if progress is not None:
                progress(f"video {index + 1}/{len(pairs)}: {pair.ref.label}")
            frames = {"ref": pair.ref.take_frames(read_frames), "test": pair.test.take_frames(read_frames)}
            if pair.noise is not None:
                frames["noise"] = pair.noise.take_frames(read_frames)
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
            diff = np.clip(
                np.abs(frames["test"].astype(np.float32) - frames["ref"].astype(np.float32)) * self.options.diff_gain,
                0,
                255,
            ).astype(np.uint8)
            fps = int(pair.ref.record.fps or 8)
            diff_videos.append(self._write_diff(diff, diff_dir / f"{index:03d}-diff.mp4", fps))
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


def describe_write_error(err: BaseException) -> str:
    """Why a file was not written: 'disk full (ENOSPC)', a permission, the encoder's message."""
    from sagevideo.outputs.video import VideoWriteError, describe_os_error

    if isinstance(err, VideoWriteError):  # "NAME not written: REASON"
        return str(err).split(" not written: ", 1)[-1]
    return describe_os_error(err) if isinstance(err, OSError) else str(err)


def _default_root() -> Path:
    from sagevideo.eval.weights import default_weights_dir

    return default_weights_dir()


VERSIONED = ("torch", "torchmetrics", "transformers", "diffusers", "imageio", "imageio-ffmpeg", "numpy", "scipy",
             "matplotlib", "torch-fidelity")  # what computes or draws the numbers


def versions() -> dict[str, str]:
    """Versions of what computed the numbers (packages not installed are left out)."""
    from sagevideo.version import __version__, package_versions

    found = {"sagevideo": __version__, "python": platform.python_version(), "platform": platform.platform()}
    return {**found, **{name: v for name, v in package_versions(VERSIONED).items() if v is not None}}


def arm_settings(arm: Arm) -> dict[str, Any]:
    """What the manifest says about how an arm was made: settings and the backends that ran."""
    from collections import Counter

    records = [v.record for v in arm.videos.values()]
    counts: Counter = Counter()
    fallbacks: Counter = Counter()
    for r in records:
        backends = r.backends or {}
        counts.update(backends.get("counts") or {})
        fallbacks.update(backends.get("fallbacks") or {})
    settings: dict[str, Any] = {}
    for name in (
        "model",
        "model_fingerprint",
        "attention",
        "pv",
        "backend",
        "plan",
        "plan_sha256",
        "device",
        "dtype",
        "steps",
        "guidance",
        "frames",
        "height",
        "width",
        "fps",
        "sagevideo_version",
    ):
        values = list(dict.fromkeys(json.dumps(getattr(r, name), sort_keys=True) for r in records))
        settings[name] = json.loads(values[0]) if len(values) == 1 else [json.loads(v) for v in values]
    settings["backends_ran"] = dict(counts.most_common())
    settings["fallbacks"] = dict(fallbacks.most_common())
    return settings


def evaluate(
    ref_dir: str | Path,
    test_dir: str | Path,
    *,
    out: str | Path,
    noise_ref: str | Path | None = None,
    options: EvalOptions | None = None,
    records: dict[str, list[ManifestRecord]] | None = None,
    attention_probe: dict[str, Any] | None = None,
    run_info: dict[str, Any] | None = None,
    notes: Sequence[str] = (),
    echo: Callable[[str], None] = print,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Compare TEST with REF (and the noise floor NOISE with REF); write metrics.json and report.html.

    records: per role ("ref", "test", "noise"), the manifest records to pair instead of the
    folders' manifests (`sagevideo ab` passes the records its runs returned). attention_probe:
    `probe.probe_run(...)` results to include. run_info: settings of the run to show (ab: the
    job file, model, plan). Returns the metrics.json content (with non-finite floats as floats).
    """
    options = options or EvalOptions()
    keys = check_metrics(options.metrics)
    if options.lpips_net not in LPIPS_FILES:
        raise EvalInputError(f"--lpips-net {options.lpips_net}: use one of {', '.join(LPIPS_FILES)}")
    encoder = encoder_problem()  # else every video would read as truncated
    if encoder:
        raise EvalInputError(encoder)
    out_dir = prepare_out(out)
    pairs, arms = plan_pairs(ref_dir, test_dir, noise_ref, records=records)  # PairingError: before any model
    unclean = setting_notes(pairs)
    for line in unclean:  # e.g. arms with different steps: said on the console, not only in metrics.json
        echo(f"sagevideo eval: WARNING: {line}")
    all_notes = list(notes) + unclean
    runner = _Runner(keys, options, echo)
    collected = runner.run(pairs, out_dir, progress)
    b = options.bootstrap
    metrics: dict[str, dict[str, Any]] = {}
    for key in runner.keys:
        if key in collected["paired"]:
            metrics[key] = paired_entry(
                key, pairs, collected["paired"][key], b, collected.get("identical_frames") if key == "psnr" else None
            )
        elif key in collected["per_arm"]:
            metrics[key] = per_arm_entry(key, pairs, collected["per_arm"][key], b)
    set_keys = [k for k in runner.keys if k in ("fid", "kid")]
    if set_keys:
        metrics.update(set_entries(set_keys, pairs, collected["features"], options, runner.details))
    metrics = {k: metrics[k] for k in METRICS if k in metrics}
    if "lpips" in metrics:
        metrics["lpips"]["network"] = runner.details.get("lpips")
    for key in ("clipsim", "clip_t"):
        if key in metrics:
            metrics[key]["clip"] = runner.details.get("clip")
    long_prompts = collected.get("long_prompts") or {}
    if "clipsim" in metrics:
        limit = runner.clip.max_tokens
        metrics["clipsim"]["long_prompts"] = [
            {"prompt": p, "tokens": n, "limit": limit} for p, n in long_prompts.items()
        ]
        if long_prompts:
            line = (
                f"CLIPSIM: {len(long_prompts)} prompt(s) exceed CLIP's {limit} tokens and were truncated to fit "
                f"(longest {max(long_prompts.values())} tokens); their CLIPSIM sees only the start of the prompt"
            )
            all_notes.append(line)
            echo(f"sagevideo eval: {line}")
    if "fid" in metrics and not metrics["fid"]["reliable"]:
        all_notes.append(f"FID {metrics['fid']['note']}")
    verdicts = [m["verdict"]["line"] for m in metrics.values()]
    if attention_probe is not None:
        verdicts.append(probe_line(attention_probe))
    if "noise" in arms and any(
        (m.get("noise_floor") or {}).get("mean") in (0.0, float("inf"))
        for m in metrics.values()
        if m["kind"] == "paired"
    ):
        all_notes.append(
            "the noise-floor run reproduced the reference exactly (full precision is deterministic here), so the floor "
            "is zero and any change counts as beyond it; judge the size of the differences from the tables"
        )
    labels = options.labels
    result: dict[str, Any] = {
        "schema": SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "created": _now(),
        "sagevideo_version": versions()["sagevideo"],
        "arms": {
            role: {"folder": str(arm.folder), "label": labels.get(role, role), "settings": arm_settings(arm)}
            for role, arm in arms.items()
        },
        "run": run_info or {},
        "pairs": [
            {
                "prompt": p.prompt,
                "seed": p.seed,
                "frames": p.ref.frames,
                "height": p.ref.height,
                "width": p.ref.width,
                "videos": {
                    role: _rel(getattr(p, role).path, out_dir)
                    for role in ("ref", "test", "noise")
                    if getattr(p, role) is not None
                },
                "diff_video": collected["diff_videos"][i],
                "diff_gain": options.diff_gain,
            }
            for i, p in enumerate(pairs)
        ],
        "n_pairs": len(pairs),
        "n_prompts": len({p.prompt for p in pairs}),
        "bootstrap": b.as_dict(),
        "metrics": metrics,
        "skipped": runner.skipped,
        "failed": runner.failed,
        "verdicts": verdicts,
        "attention_probe": attention_probe,
        "notes": all_notes,
        "versions": versions(),
        "not_written": runner.not_written,
    }
    write_outputs(result, out_dir, runner.not_written)
    return result


def write_outputs(result: dict[str, Any], out_dir: Path, not_written: dict[str, str]) -> None:
    """The figures, metrics.json, then report.html, each whole or not at all: a file that cannot be
    written (a full disk) loses none of the others, and metrics.json lists what was not written
    before it (`not_written`, file -> reason; the difference videos' too). Raises OutputsNotWritten
    naming every file not written, in one line, once the rest is written."""
    from sagevideo.eval.report import write_report
    from sagevideo.outputs.files import write_text_atomic

    try:
        result["figures"] = write_figures(result, out_dir / "figures")
    except OSError as err:
        result["figures"] = []
        not_written["figures/"] = describe_write_error(err)
    text = json.dumps(json_safe(result), indent=2, ensure_ascii=False, allow_nan=False) + "\n"
    written = []
    for name, write in (("metrics.json", lambda: write_text_atomic(out_dir / "metrics.json", text)),
                        ("report.html", lambda: write_report(result, out_dir))):
        try:
            write()
            written.append(name)
        except OSError as err:
            not_written[name] = describe_write_error(err)
    if not_written:
        raise OutputsNotWritten(not_written_line(out_dir, not_written, written), result)


def not_written_line(out_dir: Path, not_written: dict[str, str], written: list[str]) -> str:
    """One line: the files not written grouped by reason (difference videos counted), what was kept."""
    by_reason: dict[str, list[str]] = {}
    for name, reason in not_written.items():
        by_reason.setdefault(reason, []).append(name)
    parts = []
    for reason, names in by_reason.items():
        videos = [n for n in names if n.startswith("videos/")]
        shown = [n for n in names if not n.startswith("videos/")]
        if len(videos) > 2:
            shown.append(f"the {len(videos)} difference videos {videos[0]} to {Path(videos[-1]).name}")
        else:
            shown += videos
        parts.append(f"{reason}: {', '.join(shown)} not written")
    kept = (f"the metrics are in {out_dir / 'metrics.json'}" if "metrics.json" in written
            else "no metrics.json was written")
    return f"{out_dir}: {'; '.join(parts)}; {kept}; fix that (a full disk: free space) and run the same command again"


def write_figures(result: dict[str, Any], figures_dir: Path) -> list[dict[str, str]]:
    from sagevideo.eval import plots

    figures = []
    if result.get("attention_probe"):
        figures += [
            dict(f, file=f"figures/{f['file']}") for f in plots.probe_figures(result["attention_probe"], figures_dir)
        ]
    return figures


def probe_line(probe: dict[str, Any]) -> str:
    s, f = probe["summary"], probe["floor"]
    where = s["worst_at"]["cos"] or {}
    line = (
        f"attention: worst cosine {fmt(s['cos_worst'], 6)} (layer {where.get('layer')}, step {where.get('step')}), "
        f"mean {fmt(s['cos_mean'], 6)}, worst rel-L1 {fmt(s['rel_l1_worst'])}; full-precision floor: worst cosine "
        f"{fmt(f['cos_worst'], 6)}"
    )
    rep = probe.get("reproduced") or {}
    if rep and not rep.get("all_identical"):
        line += "; WARNING: the probed run did not reproduce the quantized arm's videos exactly"
    return line


def _rel(path: Path, start: Path) -> str:
    """A relative link from `start` to `path` (the report uses relative links only)."""
    return Path(os.path.relpath(Path(path).resolve(), Path(start).resolve())).as_posix()


def _now() -> str:
    from sagevideo.outputs.manifest import now_iso

    return now_iso()


__all__ = [
    "EvalInputError",
    "EvalOptions",
    "MetricModelError",
    "PairingError",
    "evaluate",
    "check_metrics",
    "plan_pairs",
]
