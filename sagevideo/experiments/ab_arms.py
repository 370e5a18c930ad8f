"""`sagevideo ab --arm NAME=SETTINGS`: arms that differ in recipe, each against full precision.

An arm is 'NAME=SETTINGS', SETTINGS the recipe's text form (`sagevideo.jobs.recipe.parse_recipe`)
plus `attention` (sage, the default, or full) and `pv` (auto, fp16, fp8), e.g.
  sage=attention=sage
  sage-fp8=attention=sage,linear=fp8
  sage-cache=attention=sage,cache=first-block,cache_threshold=0.1
Every arm runs the job file's prompts, seeds and sizes (so the same initial latents) into
out/arms/NAME/, beside the reference out/full/ and its repeat out/full-repeat/ (the noise
floor); each is evaluated against the reference by `sagevideo.eval.evaluate.evaluate` into
out/evals/NAME/ (its own metrics.json and report.html), and out/metrics.json (schema
"sagevideo.ab.arms", version 1) with out/report.html summarize them: per arm its settings,
recipe as applied (manifest `recipe`), denoise time (manifest `timings.denoise_s`, summed, and
as a ratio to the reference's), steps the cache skipped, and each metric's difference, noise
floor, excess and verdict.
"""

from __future__ import annotations

import html
import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from sagevideo.choices import ATTENTIONS
from sagevideo.errors import InputError
from sagevideo.jobs.recipe import Recipe, parse_recipe

ARMS_SCHEMA = "sagevideo.ab.arms"
ARMS_SCHEMA_VERSION = 1
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]{0,63}$")
_PVS = ("auto", "fp16", "fp8")
ARMS_HELP = (
    "A recipe arm NAME=SETTINGS (repeatable), SETTINGS the recipe's text form plus attention and pv, e.g. "
    "sage-fp8=attention=sage,linear=fp8; each arm runs beside full precision and is evaluated against it, "
    "metrics.json and report.html summarize the arms (docs/recipe.md). With --arm, --plan, --pv and the recipe "
    "options are given per arm."
)


class RecipeArm(BaseModel):
    """One `--arm`: its name (a folder name), attention, P·V precision (None: auto) and recipe."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    text: str
    attention: str = "sage"
    pv: str | None = None
    recipe: Recipe = Recipe()

    def generate_settings(self) -> dict[str, Any]:
        """The `plan_batch` keywords of this arm (attention, pv, the recipe's flat fields)."""
        settings: dict[str, Any] = {"attention": self.attention, **self.recipe.model_dump()}
        if self.pv is not None:
            settings["pv"] = self.pv
        return settings

    def label(self) -> str:
        """e.g. 'sage/fp16 + fp8' or 'full + first-block@0.1'."""
        attention = self.attention + (f"/{self.pv}" if self.pv else "")
        return attention if self.recipe.is_plain else f"{attention} + {self.recipe.label()}"


def parse_arm(text: str) -> RecipeArm:
    """A `RecipeArm` from 'NAME=SETTINGS' (see the module docstring); InputError naming the bad part."""
    name, sep, settings = text.partition("=")
    name = name.strip()
    where = f"--arm {text!r}"
    if not sep or not _NAME.match(name):
        raise InputError(f"{where}: give NAME=SETTINGS, NAME letters, digits, '.', '_', '+' or '-' "
                         "(e.g. sage-fp8=attention=sage,linear=fp8)")
    attention, pv, rest = "sage", None, []
    for part in filter(None, (p.strip() for p in settings.split(","))):
        key, _, value = part.partition("=")
        key, value = key.strip().replace("-", "_"), value.strip()
        if key == "attention":
            if value not in ATTENTIONS:
                raise InputError(f"{where}: attention={value}: use one of {', '.join(ATTENTIONS)}")
            attention = value
        elif key == "pv":
            if value not in _PVS:
                raise InputError(f"{where}: pv={value}: use one of {', '.join(_PVS)}")
            pv = value
        else:
            rest.append(part)
    if pv is not None and attention != "sage":
        raise InputError(f"{where}: pv={pv} applies to attention=sage only")
    try:
        recipe = parse_recipe(",".join(rest))
    except ValueError as err:
        raise InputError(f"{where}: {err} (or attention, pv)") from None
    for _, option, problem in recipe.problems():
        raise InputError(f"{where}: {option.lstrip('-').replace('-', '_', 1)}: {problem}")
    return RecipeArm(name=name, text=settings, attention=attention, pv=pv, recipe=recipe)


def parse_arms(texts: list[str]) -> list[RecipeArm]:
    """Every `--arm`, checked (duplicate names refused); InputError listing each problem."""
    arms, problems = [], []
    for text in texts:
        try:
            arms.append(parse_arm(text))
        except InputError as err:
            problems.append(str(err))
    seen: set[str] = set()
    for arm in arms:
        if arm.name in seen:
            problems.append(f"--arm {arm.name}: the name is given twice; each arm needs its own")
        seen.add(arm.name)
    if problems:
        raise InputError("; ".join(problems))
    return arms


def _sum(values: list[float | None]) -> float | None:
    return sum(values) if values and all(v is not None for v in values) else None  # type: ignore[misc]


def denoise_seconds(records: list[Any]) -> float | None:
    """Total `timings.denoise_s` of an arm's records (None when a record lacks it)."""
    return _sum([(r.timings or {}).get("denoise_s") for r in records])


def arm_summary(arm: RecipeArm, records: list[Any], ref_records: list[Any], result: dict[str, Any],
                eval_dir: Path, out_dir: Path) -> dict[str, Any]:
    """One arm's line of the summary: settings, recipe as applied, timings, metrics vs the floor."""
    denoise, ref_denoise = denoise_seconds(records), denoise_seconds(ref_records)
    applied = [r.recipe for r in records if r.recipe]
    skipped = _sum([(r.recipe or {}).get("cache_skipped") for r in records]) if applied else None
    forwards = _sum([(r.recipe or {}).get("cache_forwards") for r in records]) if applied else None
    metrics = {
        key: {
            "name": m.get("name", key),
            "difference": (m.get("difference") or {}).get("mean"),
            "noise_floor": (m.get("noise_floor") or {}).get("mean"),
            "excess": (m.get("excess") or {}).get("mean"),
            "within_noise_floor": m["verdict"].get("within_noise_floor"),
            "direction": m["verdict"].get("direction"),
            "verdict": m["verdict"]["line"],
        }
        for key, m in result["metrics"].items()
    }
    return {
        "name": arm.name,
        "settings": arm.text,
        "label": arm.label(),
        "attention": arm.attention,
        "pv": sorted({r.pv for r in records if r.pv}) or None,
        "recipe": arm.recipe.settings(),
        "recipe_applied": applied[0] if applied else None,
        "folder": str(Path("arms") / arm.name),
        "evaluation": {"metrics_json": _rel(eval_dir / "metrics.json", out_dir),
                       "report": _rel(eval_dir / "report.html", out_dir)},
        "timings": {
            "denoise_s": denoise,
            "denoise_s_per_job": [(r.timings or {}).get("denoise_s") for r in records],
            "reference_denoise_s": ref_denoise,
            "speedup_vs_reference": ref_denoise / denoise if denoise and ref_denoise else None,
        },
        "cache_forwards": forwards,
        "cache_skipped": skipped,
        "metrics": metrics,
        "verdicts": [f"{arm.name}: {line}" for line in result["verdicts"]],
        "failed": result.get("failed") or {},
    }


def _rel(path: Path, start: Path) -> str:
    return Path(path).resolve().relative_to(Path(start).resolve()).as_posix()


def _num(value: Any, digits: int = 4) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return html.escape(str(value))


def render_arms(result: dict[str, Any]) -> str:
    """report.html of an arms run: one row per arm, a column per metric (difference vs the floor)."""
    from sagevideo.eval.report import CSS

    keys = list(dict.fromkeys(k for arm in result["arms"] for k in arm["metrics"]))
    head = "".join(f"<th>{html.escape(k)}: difference (floor) verdict</th>" for k in keys)
    rows = []
    for arm in result["arms"]:
        t = arm["timings"]
        cells = []
        for k in keys:
            m = arm["metrics"].get(k)
            if m is None:
                cells.append("<td>–</td>")
                continue
            verdict = "within the floor" if m["within_noise_floor"] else f"beyond the floor ({m['direction']})"
            if m["within_noise_floor"] is None:
                verdict = "no floor"
            cells.append(f"<td class='num'>{_num(m['difference'])} ({_num(m['noise_floor'])}) {verdict}</td>")
        skipped = "–" if arm["cache_skipped"] is None else f"{arm['cache_skipped']} of {arm['cache_forwards']}"
        rows.append(
            f"<tr><td><a href='{html.escape(arm['evaluation']['report'])}'>{html.escape(arm['name'])}</a></td>"
            f"<td><code>{html.escape(arm['settings'])}</code><br>{html.escape(arm['label'])}</td>"
            f"<td class='num'>{_num(t['denoise_s'], 3)}</td><td class='num'>{_num(t['speedup_vs_reference'], 3)}</td>"
            f"<td class='num'>{skipped}</td>{''.join(cells)}</tr>"
        )
    notes = "".join(f"<li>{html.escape(n)}</li>" for n in result["notes"])
    run = result["run"]
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>sagevideo ab: recipe arms</title>
<style>{CSS}</style></head><body>
<h1>sagevideo ab: recipe arms vs full precision</h1>
<p class="small">job file <code>{html.escape(str(run.get('job_file')))}</code>, model
<code>{html.escape(str(run.get('model')))}</code>, {result['n_pairs']} video(s) per arm; reference
denoise {_num(result['reference']['denoise_s'], 3)} s. Each arm's full evaluation: follow its name.</p>
<h2>Which setting costs what</h2>
<table><tr><th>arm</th><th>settings</th><th>denoise s</th><th>× reference</th><th>cache skipped</th>{head}</tr>
{''.join(rows)}</table>
{f'<h3>Notes</h3><ul class="note">{notes}</ul>' if notes else ''}
</body></html>
"""
