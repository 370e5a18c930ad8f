"""report.html: the evaluation for people. Static HTML, relative links only, no external assets.

Sections: verdicts (one line per metric), notes and skipped metrics, the metric table with
95% CIs, the attention probe (summary, worst layers, plots), side-by-side videos per prompt
(reference | test | amplified difference), and the run's settings and versions. Each <video>
marks itself data-state="loaded" or "error" once the browser has tried it (used by the
headless-Chromium check).
"""

from __future__ import annotations

import html
import math
from pathlib import Path
from typing import Any

from sagevideo.eval.stats import fmt

CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px auto;max-width:1200px;
 padding:0 16px;color:#1d1d1f}
h1{font-size:22px;margin-bottom:4px} h2{font-size:18px;margin-top:32px;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:8px 0 16px} th,td{border:1px solid #ddd;padding:4px 8px;text-align:left;
 vertical-align:top} th{background:#f5f5f7} td.num{text-align:right;font-variant-numeric:tabular-nums}
.verdict{padding:6px 10px;margin:4px 0;border-left:5px solid #999;background:#fafafa}
.within{border-color:#2e9b4f} .worse{border-color:#d93025} .better{border-color:#1a73e8} .unknown{border-color:#999}
.note{color:#555} .small{font-size:12px;color:#666}
.videos{display:flex;gap:12px;flex-wrap:wrap;align-items:flex-start}
.videos figure{margin:0} .videos figcaption{font-size:12px;color:#444}
video{width:256px;background:#000;image-rendering:pixelated}
img.plot{max-width:100%;border:1px solid #eee}
code{background:#f2f2f2;padding:0 3px}
"""

JS = """
document.querySelectorAll('video').forEach(function(v){
  v.addEventListener('loadeddata',function(){v.dataset.state='loaded';});
  v.addEventListener('error',function(){v.dataset.state='error';},true);
  if(v.readyState>=2){v.dataset.state='loaded';}
});
function playRow(id){document.querySelectorAll('#'+id+' video').forEach(function(v){v.currentTime=0;v.play();});}
"""


def _e(text: Any) -> str:
    return html.escape(str(text), quote=True)


def _num(x: Any, digits: int = 4) -> str:
    if isinstance(x, str):
        x = float(x)
    return fmt(x, digits) if isinstance(x, (int, float)) and not isinstance(x, bool) else ("–" if x is None else _e(x))


def _stat(s: dict[str, Any] | None, unit: str = "", digits: int = 4) -> str:
    """'mean [lo, hi]' (± std where given)."""
    if not s or s.get("mean") is None:
        return "–"
    text = _num(s["mean"], digits) + (f" {unit}" if unit else "")
    if s.get("std") is not None:
        text += f" ± {_num(s['std'], digits)}"
    if s.get("ci95"):
        lo, hi = s["ci95"]
        text += f' <span class="small">[{_num(lo, digits)}, {_num(hi, digits)}]</span>'
    if s.get("n_infinite") and s["n_infinite"] == s.get("n"):
        text += f' <span class="small">(all {s["n"]} identical)</span>'
    elif s.get("n_infinite"):
        text += f' <span class="small">({s["n_infinite"]} of {s["n"]} ∞, left out of the mean)</span>'
    return text


def _verdict_class(v: dict[str, Any]) -> str:
    if v.get("within_noise_floor") is True:
        return "within"
    if v.get("within_noise_floor") is None:
        return "unknown"
    return {"worse": "worse", "better": "better"}.get(v.get("direction") or "", "worse")


def _metric_table(result: dict[str, Any]) -> str:
    labels = {role: arm["label"] for role, arm in result["arms"].items()}
    has_noise = "noise" in result["arms"]
    head = ["metric", f"{_e(labels['ref'])}", f"{_e(labels['test'])}"]
    if has_noise:
        head.append(_e(labels["noise"]))
    head += [
        "difference: test vs reference",
        "noise floor: noise vs reference",
        "test − noise floor",
        "N (prompts)",
        "verdict",
    ]
    rows = ["<tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr>"]
    for key, m in result["metrics"].items():
        unit = m.get("unit") or ""
        arrow = "higher is better" if m["higher_is_better"] else "lower is better"
        cells = [f"<b>{_e(m['name'])}</b><br><span class='small'>{_e(arrow)}; {_e(m['kind'])}</span>"]
        for role in ["ref", "test"] + (["noise"] if has_noise else []):
            cells.append(
                f"<td class='num'>{_stat(m.get(role), unit)}</td>"
                if m["kind"] == "per_arm"
                else "<td class='num small'>n/a</td>"
            )
        cells[1:] = [c for c in cells[1:]]
        extra = ""
        if key == "fid":
            extra = (
                f"<br><span class='small'>{m['frames_per_arm']} frames per arm"
                + ("" if m["reliable"] else "; <b>unreliable</b> (&lt; 2,048)")
                + "</span>"
            )
        if key == "kid":
            extra = (
                f"<br><span class='small'>± std over {m['subsets']} subsets of {m['subset_size']}; CI from "
                f"{m['bootstrap_subsets']} subsets per resample</span>"
            )
        cells.append(f"<td class='num'>{_stat(m.get('difference'), unit)}{extra}</td>")
        cells.append(f"<td class='num'>{_stat(m.get('noise_floor'), unit)}</td>")
        cells.append(f"<td class='num'>{_stat(m.get('excess'), unit)}</td>")
        cells.append(f"<td class='num'>{m['n']} ({m['n_prompts']})</td>")
        v = m["verdict"]
        state = {"within": "within noise floor", "unknown": "no noise floor"}.get(
            _verdict_class(v), f"beyond ({v.get('direction')})"
        )
        cells.append(f"<td class='{_verdict_class(v)}'>{_e(state)}</td>")
        rows.append("<tr><td>" + cells[0] + "</td>" + "".join(cells[1:]) + "</tr>")
    return "<table>" + "".join(rows) + "</table>"


def _probe_section(result: dict[str, Any]) -> str:
    probe = result.get("attention_probe")
    if not probe:
        return (
            "<p class='note'>No attention probe in this evaluation (<code>sagevideo ab --attention-probe</code> "
            "measures each layer's attention error during the run).</p>"
        )
    s, f = probe["summary"], probe["floor"]
    parts = [
        f"<p>Quantized attention against {_e(probe['reference'])}, {_e(probe['slices'])}. "
        f"Floor: {_e(probe['floor_is'])}. {s['calls']} attention calls measured.</p>"
    ]
    rows = [
        "<tr><th></th><th>cosine mean</th><th>cosine worst</th><th>rel-L1 mean</th><th>rel-L1 worst</th>"
        "<th>RMSE mean</th><th>RMSE worst</th><th>worst cosine at</th></tr>"
    ]
    for label, d in (("quantized", s), ("full-precision floor", f)):
        at = d["worst_at"]["cos"] or {}
        rows.append(
            f"<tr><td>{label}</td>"
            + "".join(
                f"<td class='num'>{_num(d[k], 6 if k.startswith('cos') else 4)}</td>"
                for k in ("cos_mean", "cos_worst", "rel_l1_mean", "rel_l1_worst", "rmse_mean", "rmse_worst")
            )
            + f"<td>layer {_e(at.get('layer'))}, step {_e(at.get('step'))}, prompt {_e(at.get('prompt'))!s}</td></tr>"
        )
    parts.append("<table>" + "".join(rows) + "</table>")
    rep = probe.get("reproduced") or {}
    if rep:
        ok = rep.get("all_identical")
        parts.append(
            f"<p class='{'note' if ok else 'worse verdict'}'>"
            + (
                "The probed run reproduced every quantized video exactly (same frames after encoding)."
                if ok
                else "<b>The probed run did not reproduce the quantized arm's videos exactly</b> "
                "(largest uint8 difference: "
                + ", ".join(_e(v["max_abs_diff"]) for v in rep.get("videos", []))
                + "): the arm was not made with "
                "the attention the probe installed (e.g. a plan the generator did not apply)."
            )
            + "</p>"
        )
    layers = sorted(probe["layers"], key=lambda e: e["cos_worst"])
    rows = [
        "<tr><th>layer</th><th>modes</th><th>calls</th><th>cosine mean</th><th>cosine worst</th>"
        "<th>worst at step</th><th>rel-L1 worst</th><th>RMSE worst</th><th>floor cosine worst</th></tr>"
    ]
    for e in layers:
        rows.append(
            f"<tr><td>{_e(e['layer'])}</td><td>{_e(', '.join(e.get('modes', [])))}</td>"
            f"<td class='num'>{e['calls']}</td>"
            f"<td class='num'>{_num(e['cos_mean'], 6)}</td><td class='num'>{_num(e['cos_worst'], 6)}</td>"
            f"<td class='num'>{_e(e['cos_worst_step'])}</td><td class='num'>{_num(e['rel_l1_worst'])}</td>"
            f"<td class='num'>{_num(e['rmse_worst'])}</td><td class='num'>{_num(e.get('floor_cos_worst'), 6)}</td></tr>"
        )
    parts.append(
        f"<details open><summary>All {len(layers)} layers, worst first</summary><table>"
        + "".join(rows)
        + "</table></details>"
    )
    return "".join(parts)


def _sparse_section(result: dict[str, Any]) -> str:
    """Per layer of a test arm that ran block-sparse layers: the density reached and the quality cost."""
    sparse = result.get("sparse")
    if not sparse:
        return ""
    probed = any("probe_cos_worst" in row for row in sparse["layers"])
    head = ("<tr><th>layer</th><th>calls</th><th>sparse calls</th><th>density (sparse calls)</th><th>least density</th>"
            "<th>density (all calls)</th><th>planned sparse, ran dense</th><th>on reused lists</th>"
            + ("<th>cosine worst vs fp32 dense</th><th>rel-L1 worst</th><th>floor cosine worst</th>" if probed else "")
            + "</tr>")
    rows = [head]
    for row in sparse["layers"]:
        dense = "; ".join(f"{n}× {reason}" for reason, n in row["dense"].items()) or "–"
        cells = [_e(row["layer"]), row["calls"], row["sparse_calls"], _num(row["sparse_density"], 4),
                 _num(row["min_density"], 4), _num(row["density"], 4), _e(dense), row.get("reused", 0)]
        if probed:
            cells += [_num(row.get("probe_cos_worst"), 6), _num(row.get("probe_rel_l1_worst")),
                      _num(row.get("probe_floor_cos_worst"), 6)]
        rows.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    return (f"<h2>Block-sparse attention per layer</h2><p>Density: {_e(sparse['density_is'])}. Quality cost: "
            f"{_e(sparse['quality_cost'])}.</p><table>{''.join(rows)}</table>"
            f"<p class='note'>{_e(sparse['note'])}</p>")


def _videos_section(result: dict[str, Any]) -> str:
    labels = {role: arm["label"] for role, arm in result["arms"].items()}
    per_pair: dict[int, list[str]] = {}
    for m in result["metrics"].values():
        for i, p in enumerate(m.get("per_pair") or []):
            value = p.get("difference")
            if value is not None:
                per_pair.setdefault(i, []).append(f"{m['name']} {'Δ ' if m['kind'] == 'per_arm' else ''}{_num(value)}")
    blocks = []
    for i, pair in enumerate(result["pairs"]):
        videos = pair["videos"]
        figs = [
            (videos["ref"], labels["ref"]),
            (videos["test"], labels["test"]),
            (pair["diff_video"], f"|test − reference| × {fmt(pair['diff_gain'])}"),
        ]
        row_id = f"row{i}"
        items = "".join(
            f"<figure><video src='{_e(src)}' controls loop muted playsinline preload='auto'></video>"
            f"<figcaption>{_e(caption)}<br><a href='{_e(src)}'>{_e(Path(src).name)}</a></figcaption></figure>"
            if src is not None else  # a difference video that could not be written (metrics.json: not_written)
            f"<figure><figcaption>{_e(caption)}<br>not written</figcaption></figure>"
            for src, caption in figs
        )
        values = "; ".join(per_pair.get(i, []))
        blocks.append(
            f"<h3>{_e(pair['prompt'])} <span class='small'>seed {pair['seed']}, {pair['frames']} frames, "
            f"{pair['width']}×{pair['height']}</span></h3>"
            f"<div class='videos' id='{row_id}'>{items}</div>"
            f"<p class='small'><button onclick=\"playRow('{row_id}')\">play row from start</button> {values}</p>"
        )
    return "".join(blocks)


def _settings_section(result: dict[str, Any]) -> str:
    parts = []
    run = result.get("run") or {}
    if run:
        rows = "".join(f"<tr><th>{_e(k)}</th><td>{_e(_plain(v))}</td></tr>" for k, v in run.items())
        parts.append(f"<h3>Run</h3><table>{rows}</table>")
    roles = list(result["arms"])
    names = list(next(iter(result["arms"].values()))["settings"])
    rows = ["<tr><th>setting</th>" + "".join(f"<th>{_e(result['arms'][r]['label'])}</th>" for r in roles) + "</tr>"]
    rows.append("<tr><th>folder</th>" + "".join(f"<td>{_e(result['arms'][r]['folder'])}</td>" for r in roles) + "</tr>")
    for name in names:
        rows.append(
            f"<tr><th>{_e(name)}</th>"
            + "".join(f"<td>{_e(_plain(result['arms'][r]['settings'].get(name)))}</td>" for r in roles)
            + "</tr>"
        )
    parts.append("<h3>Arms (from their manifests)</h3><table>" + "".join(rows) + "</table>")
    metric_rows = []
    for m in result["metrics"].values():
        extra = m.get("clip") or m.get("network") or m.get("features")
        metric_rows.append(
            f"<tr><th>{_e(m['name'])}</th><td>{_e(m['description'])}"
            + (f"<br><span class='small'>{_e(_plain(extra))}</span>" if extra else "")
            + "</td></tr>"
        )
    for key, line in (result.get("skipped") or {}).items():
        metric_rows.append(f"<tr><th>{_e(key)}</th><td class='note'>{_e(line)}</td></tr>")
    parts.append("<h3>Metrics</h3><table>" + "".join(metric_rows) + "</table>")
    b = result["bootstrap"]
    parts.append(
        f"<p class='small'>Confidence intervals: {_e(b['method'])}, unit {_e(b['unit'])}, "
        f"{b['resamples']} resamples ({b['set_resamples']} for FID/KID), {int(b['confidence'] * 100)}%, "
        f"seed {b['seed']}. Verdict: within the noise floor when the CI of (test − noise floor) contains 0.</p>"
    )
    rows = "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in result["versions"].items())
    parts.append(f"<h3>Versions</h3><table>{rows}</table>")
    return "".join(parts)


def _plain(value: Any) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k}: {_plain(v)}" for k, v in value.items()) or "–"
    if isinstance(value, list):
        return "; ".join(_plain(v) for v in value) or "–"
    if isinstance(value, float) and (math.isinf(value) or math.isnan(value)):
        return fmt(value)
    return "–" if value is None else str(value)


def render(result: dict[str, Any]) -> str:
    labels = {role: arm["label"] for role, arm in result["arms"].items()}
    verdicts = []
    for m in result["metrics"].values():
        verdicts.append(f"<div class='verdict {_verdict_class(m['verdict'])}'>{_e(m['verdict']['line'])}</div>")
    if result.get("attention_probe"):
        from sagevideo.eval.results import probe_line

        verdicts.append(f"<div class='verdict unknown'>{_e(probe_line(result['attention_probe']))}</div>")
    notes = "".join(f"<li>{_e(n)}</li>" for n in result.get("notes") or [])
    skipped = "".join(f"<li>{_e(line)}</li>" for line in dict.fromkeys((result.get("skipped") or {}).values()))
    figures = "".join(
        f"<figure><img class='plot' src='{_e(f['file'])}' alt='{_e(f['title'])}'><figcaption class='small'>"
        f"{_e(f['title'])}</figcaption></figure>"
        for f in result.get("figures") or []
    )
    arms = ", ".join(f"<b>{_e(labels[r])}</b> (<code>{_e(result['arms'][r]['folder'])}</code>)" for r in labels)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>sagevideo evaluation: {_e(labels["test"])} vs {_e(labels["ref"])}</title><style>{CSS}</style></head>
<body>
<h1>sagevideo evaluation: {_e(labels["test"])} vs {_e(labels["ref"])}</h1>
<p class="small">{result["n_pairs"]} paired videos, {result["n_prompts"]} prompts. Arms: {arms}.
Created {_e(result["created"])}; machine-readable: <a href="metrics.json">metrics.json</a>
(schema {_e(result["schema"])} v{result["schema_version"]}).</p>
<h2>Verdicts</h2>
{"".join(verdicts) or "<p>No metric ran.</p>"}
{f'<h3>Notes</h3><ul class="note">{notes}</ul>' if notes else ""}
{f'<h3>Skipped</h3><ul class="note">{skipped}</ul>' if skipped else ""}
<h2>Metrics (mean, 95% CI over prompts)</h2>
{_metric_table(result)}
<h2>Attention error per layer</h2>
{_probe_section(result)}
{_sparse_section(result)}
{figures}
<h2>Videos</h2>
<p class="small">Each row: {_e(labels["ref"])} | {_e(labels["test"])} | amplified absolute difference.</p>
{_videos_section(result)}
<h2>Settings</h2>
{_settings_section(result)}
<script>{JS}</script>
</body></html>
"""


def write_report(result: dict[str, Any], out_dir: str | Path) -> Path:
    """report.html in `out_dir`, whole or not at all (OSError, e.g. ENOSPC: an earlier one stays)."""
    from sagevideo.outputs.files import write_text_atomic

    return write_text_atomic(Path(out_dir) / "report.html", render(result))
