"""The metric entries of an evaluation report: what each metric is, and its summary per kind.

paired (PSNR, SSIM, LPIPS: test vs reference per pair, against the noise floor), per-arm
(CLIPSIM, CLIP-T: each arm's own score and their difference) and set metrics (FID, KID over all
frames, with prompt-bootstrap CIs). Every summary carries its worst cases and a verdict.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from sagevideo.eval.pairing import Pair
from sagevideo.eval.stats import Bootstrap, paired_excess, summarize, verdict

if TYPE_CHECKING:
    from sagevideo.eval.evaluate import EvalOptions

# key -> (name, kind, unit, higher_is_better, description)
METRIC_INFO: dict[str, tuple[str, str, str, bool, str]] = {
    "psnr": (
        "PSNR",
        "paired",
        " dB",
        True,
        "per-frame PSNR of test vs reference (RGB in [0, 1], data range fixed at 1.0), mean per video; "
        "identical frames (∞) are counted and left out of the mean",
    ),
    "ssim": (
        "SSIM",
        "paired",
        "",
        True,
        "per-frame SSIM (torchmetrics, 11×11 Gaussian, data range 1.0), mean per video",
    ),
    "lpips": ("LPIPS", "paired", "", False, "per-frame LPIPS (0 = identical), mean per video"),
    "clipsim": (
        "CLIPSIM",
        "per_arm",
        "",
        True,
        "mean frame–prompt cosine of CLIP ViT-B/32 embeddings (plain cosine, not ×100)",
    ),
    "clip_t": ("CLIP-T", "per_arm", "", True, "mean cosine of consecutive frames' CLIP embeddings"),
    "fid": ("FID", "set", "", False, "Fréchet distance between the arms' frame features (reference = real)"),
    "kid": (
        "KID",
        "set",
        "",
        False,
        "kernel inception distance between the arms' frame features, mean ± std over subsets",
    ),
}


def metric_entry(key: str, pairs: list[Pair], bootstrap: Bootstrap) -> dict[str, Any]:
    name, kind, unit, hib, description = METRIC_INFO[key]
    return {
        "name": name,
        "kind": kind,
        "unit": unit.strip(),
        "higher_is_better": hib,
        "description": description,
        "n": len(pairs),
        "n_prompts": len({p.prompt for p in pairs}),
    }


def paired_entry(
    key: str,
    pairs: list[Pair],
    values: dict[str, list[float]],
    bootstrap: Bootstrap,
    identical: dict[str, int] | None = None,
) -> dict[str, Any]:
    import math

    prompts = [p.prompt for p in pairs]
    entry = metric_entry(key, pairs, bootstrap)
    entry["difference"] = summarize(values["test"], prompts, bootstrap)
    noise = values.get("noise")
    entry["noise_floor"] = summarize(noise, prompts, bootstrap) if noise is not None else None
    entry["excess"] = paired_excess(values["test"], noise, prompts, bootstrap) if noise is not None else None
    note = ""
    if key == "psnr" and noise is not None:
        n_noise_inf = sum(1 for v in noise if math.isinf(v))
        n_test_inf = sum(1 for v in values["test"] if math.isinf(v))
        note = (
            f"the noise-floor run repeats the reference exactly (PSNR ∞) for {n_noise_inf} of {len(noise)} videos, "
            f"the test arm for {n_test_inf}"
        )
    entry["verdict"] = verdict(
        entry["name"], entry["excess"], entry["higher_is_better"], infinite_note=note, unit=METRIC_INFO[key][2]
    )
    entry["per_pair"] = [
        {
            "prompt": p.prompt,
            "seed": p.seed,
            "difference": values["test"][i],
            "noise_floor": None if noise is None else noise[i],
        }
        for i, p in enumerate(pairs)
    ]
    if identical is not None:
        entry["identical_videos"] = {r: sum(1 for v in vals if math.isinf(v)) for r, vals in values.items()}
        entry["identical_frames"] = identical
    return entry


def per_arm_entry(key: str, pairs: list[Pair], values: dict[str, list[float]], bootstrap: Bootstrap) -> dict[str, Any]:
    prompts = [p.prompt for p in pairs]
    entry = metric_entry(key, pairs, bootstrap)
    for arm, vals in values.items():
        entry[arm] = summarize(vals, prompts, bootstrap)
    test_diff = [t - r for t, r in zip(values["test"], values["ref"], strict=True)]
    entry["difference"] = summarize(test_diff, prompts, bootstrap)
    noise_diff = None
    if "noise" in values:
        noise_diff = [n - r for n, r in zip(values["noise"], values["ref"], strict=True)]
        entry["noise_floor"] = summarize(noise_diff, prompts, bootstrap)
        entry["excess"] = paired_excess(test_diff, noise_diff, prompts, bootstrap)
    else:
        entry["noise_floor"] = entry["excess"] = None
    entry["verdict"] = verdict(entry["name"], entry["excess"], entry["higher_is_better"])
    entry["per_pair"] = [
        {
            "prompt": p.prompt,
            "seed": p.seed,
            "ref": values["ref"][i],
            "test": values["test"][i],
            "noise": values["noise"][i] if "noise" in values else None,
            "difference": test_diff[i],
            "noise_floor": None if noise_diff is None else noise_diff[i],
        }
        for i, p in enumerate(pairs)
    ]
    return entry


def set_entries(
    keys: list[str], pairs: list[Pair], features: dict[str, list], options: EvalOptions, details: dict[str, Any]
) -> dict[str, dict[str, Any]]:
    """FID and KID over all frames, with prompt-bootstrap CIs from cached features."""
    import numpy as np
    import torch

    from sagevideo.eval import fid as fidlib
    from sagevideo.eval.stats import set_statistic_ci

    b = options.bootstrap
    order = list(dict.fromkeys(p.prompt for p in pairs))
    groups = [[i for i, p in enumerate(pairs) if p.prompt == prompt] for prompt in order]
    has_noise = "noise" in features and bool(features["noise"])

    def stack(arm: str, prompt_idx: Sequence[int]) -> torch.Tensor:
        return torch.cat([features[arm][i] for pi in prompt_idx for i in groups[pi]])

    everything = np.arange(len(order))
    n_frames = int(stack("ref", everything).shape[0])
    out: dict[str, dict[str, Any]] = {}
    if "fid" in keys:

        def fid_of(arm, idx):
            return fidlib.fid(stack("ref", idx), stack(arm, idx))

        entry = metric_entry("fid", pairs, b)
        entry["difference"] = {
            "mean": fid_of("test", everything),
            "ci95": set_statistic_ci(len(order), lambda idx: fid_of("test", idx), b),
            "n": len(pairs),
            "n_prompts": len(order),
        }
        if has_noise:
            entry["noise_floor"] = {
                "mean": fid_of("noise", everything),
                "ci95": set_statistic_ci(len(order), lambda idx: fid_of("noise", idx), b),
                "n": len(pairs),
                "n_prompts": len(order),
            }
            entry["excess"] = {
                "mean": entry["difference"]["mean"] - entry["noise_floor"]["mean"],
                "ci95": set_statistic_ci(len(order), lambda idx: fid_of("test", idx) - fid_of("noise", idx), b),
                "n": len(pairs),
                "n_prompts": len(order),
                "n_infinite": 0,
            }
        else:
            entry["noise_floor"] = entry["excess"] = None
        entry.update(fidlib.reliability(n_frames))
        entry["frames_per_arm"] = n_frames
        entry["features"] = details.get("fid")
        entry["verdict"] = verdict("FID", entry["excess"], False)
        if not entry["reliable"]:
            entry["verdict"]["line"] += f" [{entry['note']}]"
        out["fid"] = entry
    if "kid" in keys:
        size = min(fidlib.KID_SUBSET_SIZE, n_frames)

        def kid_of(arm, idx, subsets):
            return fidlib.kid(stack("ref", idx), stack(arm, idx), subsets=subsets, subset_size=size, seed=b.seed)

        entry = metric_entry("kid", pairs, b)
        bs = options.kid_bootstrap_subsets

        def kid_summary(arm):
            """KID of `arm` vs ref over every frame, with its prompt-bootstrap interval."""
            mean, std, _ = kid_of(arm, everything, options.kid_subsets)
            ci95 = set_statistic_ci(len(order), lambda idx: kid_of(arm, idx, bs)[0], b)
            return {"mean": mean, "std": std, "ci95": ci95, "n": len(pairs), "n_prompts": len(order)}

        entry["difference"] = kid_summary("test")
        mean = entry["difference"]["mean"]
        if has_noise:
            entry["noise_floor"] = kid_summary("noise")
            nmean = entry["noise_floor"]["mean"]
            entry["excess"] = {
                "mean": mean - nmean,
                "ci95": set_statistic_ci(
                    len(order), lambda idx: kid_of("test", idx, bs)[0] - kid_of("noise", idx, bs)[0], b
                ),
                "n": len(pairs),
                "n_prompts": len(order),
                "n_infinite": 0,
            }
        else:
            entry["noise_floor"] = entry["excess"] = None
        entry["subsets"] = options.kid_subsets
        entry["subset_size"] = size
        entry["bootstrap_subsets"] = bs
        entry["frames_per_arm"] = n_frames
        entry["features"] = details.get("fid")
        entry["verdict"] = verdict("KID", entry["excess"], False)
        out["kid"] = entry
    return out
