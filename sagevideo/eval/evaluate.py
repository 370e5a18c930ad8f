"""Evaluate a test arm against a reference arm: metrics.json (versioned schema) and report.html.

`evaluate(ref_dir, test_dir, out=...)` pairs the folders (`pairing`), decides which metrics can
run (weights present, or models injected), then reads each (prompt, seed) once and feeds every
metric: PSNR/SSIM/LPIPS between test and reference (and noise and reference), CLIPSIM/CLIP-T on
each arm, FID/KID features of each arm's frames. Every metric gets the difference between the
arms with a bootstrap 95% CI over prompts, N, and, with a noise-floor arm (a second
full-precision run with the same seeds), the noise floor and a verdict: within the floor when
the CI of (test − floor) contains 0.

Input problems raise `EvalInputError` (or `PairingError`) before any model is loaded. The pass over
the videos is `metric_runner.MetricRunner`'s; what is written, and how, `results`'.

metrics.json (schema "sagevideo.eval.metrics", version 1), top level:
  schema, schema_version, created, sagevideo_version, arms{ref,test,noise}: folder, label,
  settings; pairs[]: prompt, seed, frames, height, width, videos, diff_video; n_pairs, n_prompts;
  bootstrap{}; metrics{key: entry}; skipped{key: reason}; failed{key: reason} (the skipped ones
  whose weights are present but could not be loaded); verdicts[]; attention_probe; sparse (null
  unless the test arm ran block-sparse layers: `results.sparse_layers`, per layer the density
  reached and, with the probe, the attention error); notes[]; versions{}; not_written{file: reason}
  (files of --out that could not be written before metrics.json, e.g. difference videos on a full
  disk: their pairs' diff_video is null).
Metric entry: name, kind ("paired": a comparison of two videos; "per_arm": a value per video of
each arm; "set": a distance between the arms' frame sets), unit, higher_is_better, description,
n, n_prompts; ref/test/noise ({mean, ci95, ...}, per_arm only); difference (per_arm: test − ref;
otherwise the metric of test vs ref), noise_floor (the same for noise vs ref, or null), excess
(difference − noise_floor, paired by prompt), verdict{within_noise_floor, direction, line},
per_pair[]: {prompt, seed, difference, noise_floor, ref, test, noise}; plus metric extras.
Non-finite numbers are written as the strings "inf", "-inf", "nan".
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sagevideo.errors import EvalInputError, MetricModelError, PairingError
from sagevideo.eval.entries import paired_entry, per_arm_entry, set_entries
from sagevideo.eval.metric_runner import MetricRunner
from sagevideo.eval.pairing import Arm, Pair, load_arm, pair_arms, setting_notes
from sagevideo.eval.results import arm_settings, probe_line, sparse_layers, versions, write_outputs
from sagevideo.eval.stats import Bootstrap
from sagevideo.eval.weights import LPIPS_FILES, METRICS
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
    runner = MetricRunner(keys, options, echo)
    collected = runner.run(pairs, out_dir, progress)
    b = options.bootstrap
    metrics = _metric_entries(runner, pairs, collected, options)
    all_notes += _metric_notes(metrics, runner, collected, echo)
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
        "sparse": sparse_layers(arms["test"], attention_probe),
        "notes": all_notes,
        "versions": versions(),
        "not_written": runner.not_written,
    }
    write_outputs(result, out_dir, runner.not_written)
    return result


def _metric_entries(runner: MetricRunner, pairs: list[Pair], collected: dict[str, Any],
                    options: EvalOptions) -> dict[str, dict[str, Any]]:
    """metrics.json's `metrics`, in METRICS order: each metric's entry from what the runner collected,
    with the models that computed it."""
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
    return metrics


def _metric_notes(metrics: dict[str, dict[str, Any]], runner: MetricRunner, collected: dict[str, Any],
                  echo: Callable[[str], None]) -> list[str]:
    """Notes on what the metrics could not see: prompts CLIP truncated (also said on the console;
    listed in the CLIPSIM entry), an FID from too few frames."""
    notes = []
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
            notes.append(line)
            echo(f"sagevideo eval: {line}")
    if "fid" in metrics and not metrics["fid"]["reliable"]:
        notes.append(f"FID {metrics['fid']['note']}")
    return notes


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
