"""Summaries with bootstrap confidence intervals over prompts, and noise-floor verdicts.

The unit of resampling is the prompt: values of one prompt (several seeds) are averaged first,
then `scipy.stats.bootstrap` (percentile method, seeded) resamples prompts. Set metrics (FID,
KID) give a statistic of a set of prompts instead of one value per prompt; the same bootstrap
resamples prompt indices and recomputes the statistic (fewer resamples: each costs a matrix
square root).

Infinite values (PSNR of identical videos) are left out of means and counted.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

CONFIDENCE = 0.95
RESAMPLES = 1000
SET_RESAMPLES = 50
SEED = 0


@dataclass(frozen=True)
class Bootstrap:
    """Bootstrap settings, recorded in metrics.json."""

    resamples: int = RESAMPLES
    set_resamples: int = SET_RESAMPLES
    confidence: float = CONFIDENCE
    seed: int = SEED

    def as_dict(self) -> dict:
        return {
            "method": "percentile bootstrap over prompts (scipy.stats.bootstrap)",
            "unit": "prompt (seeds of one prompt averaged first)",
            "resamples": self.resamples,
            "set_resamples": self.set_resamples,
            "confidence": self.confidence,
            "seed": self.seed,
        }


def by_prompt(values: Sequence[float], prompts: Sequence[str]) -> np.ndarray:
    """Mean per prompt (first-seen order), ignoring non-finite values; NaN for a prompt with none."""
    order = list(dict.fromkeys(prompts))
    out = []
    for p in order:
        vals = np.array([v for v, q in zip(values, prompts, strict=True) if q == p], dtype=np.float64)
        finite = vals[np.isfinite(vals)]
        out.append(finite.mean() if finite.size else (vals[0] if vals.size and np.all(vals == vals[0]) else np.nan))
    return np.array(out, dtype=np.float64)


def summarize(values: Sequence[float], prompts: Sequence[str], bootstrap: Bootstrap) -> dict:
    """{"mean", "ci95", "n", "n_prompts", "n_infinite"} of per-pair values.

    mean: mean over prompts of per-prompt means of the finite values; if every value is the
    same infinity, that infinity (CI [inf, inf]). ci95: None when fewer than 2 prompts.
    """
    vals = np.asarray(values, dtype=np.float64)
    n_inf = int(np.isinf(vals).sum())
    result = {"mean": None, "ci95": None, "n": int(vals.size), "n_prompts": len(set(prompts)), "n_infinite": n_inf}
    if vals.size == 0:
        return result
    if n_inf == vals.size and np.all(vals == vals[0]):
        result.update(mean=float(vals[0]), ci95=[float(vals[0]), float(vals[0])])
        return result
    per_prompt = by_prompt(vals, prompts)
    per_prompt = per_prompt[np.isfinite(per_prompt)]
    if per_prompt.size == 0:
        return result
    result["mean"] = float(per_prompt.mean())
    result["ci95"] = ci_of_mean(per_prompt, bootstrap)
    return result


def ci_of_mean(per_prompt: np.ndarray, bootstrap: Bootstrap) -> list[float] | None:
    """Percentile bootstrap CI of the mean of per-prompt values (None for fewer than 2)."""
    if per_prompt.size < 2:
        return None
    if np.all(per_prompt == per_prompt[0]):
        return [float(per_prompt[0])] * 2
    from scipy.stats import bootstrap as scipy_bootstrap

    res = scipy_bootstrap(
        (per_prompt,),
        np.mean,
        confidence_level=bootstrap.confidence,
        n_resamples=bootstrap.resamples,
        method="percentile",
        random_state=np.random.default_rng(bootstrap.seed),
    )
    return [float(res.confidence_interval.low), float(res.confidence_interval.high)]


def set_statistic_ci(
    n_prompts: int, statistic: Callable[[np.ndarray], float], bootstrap: Bootstrap
) -> list[float] | None:
    """Percentile bootstrap CI of a statistic of a set of prompts: `statistic(prompt_indices)`."""
    if n_prompts < 2:
        return None
    from scipy.stats import bootstrap as scipy_bootstrap

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # degenerate resamples (all one prompt) warn; they are kept
        res = scipy_bootstrap(
            (np.arange(n_prompts),),
            lambda idx: statistic(np.asarray(idx, dtype=np.int64)),
            confidence_level=bootstrap.confidence,
            n_resamples=bootstrap.set_resamples,
            method="percentile",
            vectorized=False,
            random_state=np.random.default_rng(bootstrap.seed),
        )
    low, high = res.confidence_interval.low, res.confidence_interval.high
    if not (math.isfinite(low) and math.isfinite(high)):
        return None
    return [float(low), float(high)]


def paired_excess(test: Sequence[float], noise: Sequence[float], prompts: Sequence[str], bootstrap: Bootstrap) -> dict:
    """Summary of test − noise per pair (how far the test arm is beyond the noise floor).

    Infinite pairs: both +inf (two identical comparisons) count as 0; one infinite makes the
    excess that infinity, which `summarize` keeps out of the mean and counts.
    """
    diffs = []
    for a, b in zip(test, noise, strict=True):
        if math.isinf(a) and math.isinf(b) and a == b:
            diffs.append(0.0)
        elif math.isinf(b):
            diffs.append(-b)
        elif math.isinf(a):
            diffs.append(a)
        else:
            diffs.append(a - b)
    result = summarize(diffs, prompts, bootstrap)
    result["n_negative_infinite"] = sum(1 for d in diffs if d == -math.inf)
    result["n_positive_infinite"] = sum(1 for d in diffs if d == math.inf)
    return result


def verdict(
    name: str, excess: dict | None, higher_is_better: bool | None, *, infinite_note: str = "", unit: str = ""
) -> dict:
    """Within the noise floor when the CI of (test − noise floor) contains 0.

    Returns {"within_noise_floor": bool | None, "direction": "worse"/"better"/None, "line": str}.
    """
    if excess is None:
        return {
            "within_noise_floor": None,
            "direction": None,
            "line": f"{name}: no noise floor measured (give --noise-ref: a second full-precision run, same seeds)",
        }
    n_inf, n = excess.get("n_infinite", 0), excess.get("n", 0)
    lo_hi = excess.get("ci95")
    mean = excess.get("mean")
    if n_inf:
        # an infinite excess: one comparison is exact (identical videos, PSNR ∞) and the other is not
        sign = -1.0 if excess.get("n_negative_infinite", 0) >= excess.get("n_positive_infinite", 0) else 1.0
        direction = _direction(sign, higher_is_better)
        detail = infinite_note or f"{n_inf} of {n} comparisons infinite"
        return {
            "within_noise_floor": False,
            "direction": direction,
            "line": f"{name}: beyond the noise floor ({direction}): {detail}",
        }
    if mean is None:
        return {"within_noise_floor": None, "direction": None, "line": f"{name}: no value"}
    if lo_hi is None:
        within = mean == 0.0
        ci_text = "no CI (one prompt)"
    else:
        within = lo_hi[0] <= 0.0 <= lo_hi[1]
        ci_text = f"95% CI [{fmt(lo_hi[0])}, {fmt(lo_hi[1])}]"
    direction = None if within else _direction(mean, higher_is_better)
    state = "within the noise floor" if within else f"beyond the noise floor ({direction})"
    line = f"{name}: {state}: test − noise floor = {fmt(mean)}{unit}, {ci_text}"
    return {"within_noise_floor": within, "direction": direction, "line": line}


def _direction(delta: float, higher_is_better: bool | None) -> str | None:
    if higher_is_better is None or delta == 0:
        return "different" if delta else None
    return "better" if (delta > 0) == higher_is_better else "worse"


def fmt(x: float | None, digits: int = 4) -> str:
    """Compact number for lines and tables: 4 significant digits, inf as ∞."""
    if x is None:
        return "–"
    if isinstance(x, float) and math.isinf(x):
        return "∞" if x > 0 else "−∞"
    if isinstance(x, float) and math.isnan(x):
        return "nan"
    if x == 0:
        return "0"
    if abs(x) >= 1e5 or abs(x) < 1e-3:
        return f"{x:.{digits - 1}e}"
    return f"{x:.{digits}g}"


def json_safe(obj):
    """Recursively replace non-finite floats by the strings "inf", "-inf", "nan" (JSON has none)."""
    if isinstance(obj, float):
        if math.isnan(obj):
            return "nan"
        if math.isinf(obj):
            return "inf" if obj > 0 else "-inf"
        return obj
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    return obj
