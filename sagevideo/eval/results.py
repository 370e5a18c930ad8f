"""What an evaluation writes: the arms' settings from their manifests, the versions that computed
the numbers, metrics.json, report.html and the figures (each whole or not at all, with what could
not be written named), and the probe's verdict line."""

from __future__ import annotations

import json
import platform
from pathlib import Path
from typing import Any

from sagevideo.errors import OutputsNotWritten
from sagevideo.eval.pairing import Arm
from sagevideo.eval.stats import fmt, json_safe


def describe_write_error(err: BaseException) -> str:
    """Why a file was not written: 'disk full (ENOSPC)', a permission, the encoder's message."""
    from sagevideo.outputs.video import VideoWriteError, describe_os_error

    if isinstance(err, VideoWriteError):  # "NAME not written: REASON"
        return str(err).split(" not written: ", 1)[-1]
    return describe_os_error(err) if isinstance(err, OSError) else str(err)


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


SPARSE_HONESTY = (
    "A sparse plan's quality is judged on your own model and prompts: random-weight models (the tiny ones) have "
    "near-uniform attention, so their videos and errors say nothing about what sparsity costs a trained model.")


def sparse_layers(arm: Arm, probe: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """Per layer of an arm that ran block-sparse layers (its manifests' `backends.sparse`, summed over
    videos): calls, the calls the plan made sparse and their mean density, the least density, why
    planned calls ran dense, the calls on lists kept from an earlier step, and with the attention
    probe the layer's error against fp32 dense attention (quantization and sparsity together) beside
    the full-precision floor. None when no record has sparse notes."""
    merged = _merged_sparse_layers(arm)
    if not merged:
        return None
    probed = {layer["layer"]: layer for layer in (probe or {}).get("layers") or []}
    rows = []
    for row in merged.values():
        total, sparse_total = row.pop("_sum"), row.pop("_sparse_sum")
        row["density"] = round(total / row["calls"], 4)
        row["sparse_density"] = round(sparse_total / row["sparse_calls"], 4) if row["sparse_calls"] else None
        if row["layer"] in probed:
            p = probed[row["layer"]]
            row.update(probe_cos_worst=p["cos_worst"], probe_rel_l1_worst=p["rel_l1_worst"],
                       probe_floor_cos_worst=p.get("floor_cos_worst"))
        rows.append(row)
    return {
        "layers": rows,
        "density_is": "kept / all key tiles per call; sparse_density over the calls the plan made sparse, density over "
                      "every call (dense steps and layers count 1)",
        "quality_cost": ("the video metrics above, against full precision beside the noise floor; per layer, with "
                         "--attention-probe, the error against fp32 dense attention" if probed else
                         "the video metrics above, against full precision beside the noise floor (per-layer attention "
                         "error: run ab with --attention-probe)"),
        "note": SPARSE_HONESTY,
    }


def _merged_sparse_layers(arm: Arm) -> dict[str, dict[str, Any]]:
    """Layer -> its `backends.sparse` entries summed over the arm's videos (densities as sums, for means)."""
    merged: dict[str, dict[str, Any]] = {}
    for video in arm.videos.values():
        for name, entry in (((video.record.backends or {}).get("sparse") or {}).get("layers") or {}).items():
            row = merged.setdefault(name, {"layer": name, "calls": 0, "sparse_calls": 0, "_sum": 0.0,
                                           "_sparse_sum": 0.0, "min_density": 1.0, "dense": {}, "reused": 0})
            planned = entry.get("sparse_calls", 0)
            row["calls"] += entry["calls"]
            row["_sum"] += entry["density"] * entry["calls"]
            row["sparse_calls"] += planned
            row["_sparse_sum"] += entry.get("sparse_density", 0.0) * planned
            row["min_density"] = min(row["min_density"], entry["min"])
            row["reused"] += entry.get("reused", 0)
            for reason, n in (entry.get("dense") or {}).items():
                row["dense"][reason] = row["dense"].get(reason, 0) + n
    return merged


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
