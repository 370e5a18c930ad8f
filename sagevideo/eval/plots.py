"""Matplotlib figures for the report (PNG, Agg backend, no display needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

FLOOR = 1e-12  # 1 − cos is drawn on a log axis; exact agreement is drawn at this value


def _plt():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _one_minus(values) -> np.ndarray:
    return np.maximum(1.0 - np.asarray(values, dtype=np.float64), FLOOR)


def _layer_ticks(ax, names: list[str]) -> None:
    if len(names) <= 40:
        ax.set_xticks(range(len(names)))
        ax.set_xticklabels(names, rotation=75, ha="right", fontsize=7)
    else:
        ax.set_xlabel(f"layer index ({len(names)} layers, in the model's order)")


def probe_figures(probe: dict[str, Any], out_dir: str | Path) -> list[dict[str, str]]:
    """Per-layer error plots of an attention probe; returns [{"file": name, "title": ...}]."""
    plt = _plt()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    layers = probe["layers"]
    names = [entry["layer"] for entry in layers]
    x = np.arange(len(layers))
    figures = []

    fig, ax = plt.subplots(figsize=(max(6.0, 0.22 * len(layers) + 3), 4.2), dpi=110)
    ax.semilogy(x, _one_minus([e["cos_worst"] for e in layers]), "o-", ms=3, label="quantized: worst")
    ax.semilogy(x, _one_minus([e["cos_mean"] for e in layers]), "s-", ms=3, label="quantized: mean")
    floor = [e.get("floor_cos_worst") for e in layers]
    if all(f is not None for f in floor):
        ax.semilogy(x, _one_minus(floor), "--", color="gray", label="full precision (model dtype): worst")
    ax.set_ylabel("1 − cosine vs fp32 SDPA (log)")
    ax.set_title("Attention error per layer (worst over heads, steps and prompts)")
    _layer_ticks(ax, names)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out_dir / "attention_cosine_per_layer.png")
    plt.close(fig)
    figures.append({"file": "attention_cosine_per_layer.png", "title": "1 − cosine per layer (worst and mean)"})

    fig, ax = plt.subplots(figsize=(max(6.0, 0.22 * len(layers) + 3), 4.2), dpi=110)
    ax.semilogy(x, np.maximum([e["rel_l1_worst"] for e in layers], FLOOR), "o-", ms=3, label="relative L1: worst")
    ax.semilogy(x, np.maximum([e["rel_l1_mean"] for e in layers], FLOOR), "s-", ms=3, label="relative L1: mean")
    ax.semilogy(x, np.maximum([e["rmse_worst"] for e in layers], FLOOR), "^-", ms=3, label="RMSE: worst")
    ax.set_title("Relative L1 and RMSE per layer (quantized vs fp32 SDPA)")
    _layer_ticks(ax, names)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out_dir / "attention_rel_l1_per_layer.png")
    plt.close(fig)
    figures.append({"file": "attention_rel_l1_per_layer.png", "title": "relative L1 and RMSE per layer"})

    steps = sorted({s for e in layers for s in e["steps"]})
    if steps:
        grid = np.full((len(layers), len(steps)), np.nan)
        for i, e in enumerate(layers):
            for s, value in zip(e["steps"], e["cos_worst_by_step"], strict=True):
                grid[i, steps.index(s)] = value
        fig, ax = plt.subplots(figsize=(max(5.0, 0.25 * len(steps) + 3), max(3.5, 0.18 * len(layers) + 1.5)), dpi=110)
        image = ax.imshow(np.log10(_one_minus(grid)), aspect="auto", cmap="magma_r", interpolation="nearest")
        ax.set_xlabel("denoising step")
        ax.set_xticks(range(len(steps)))
        ax.set_xticklabels([str(s) for s in steps], fontsize=7)
        ax.set_ylabel("layer")
        if len(names) <= 40:
            ax.set_yticks(range(len(names)))
            ax.set_yticklabels(names, fontsize=6)
        fig.colorbar(image, ax=ax, label="log10(1 − worst cosine)")
        ax.set_title("Worst cosine by layer and step")
        fig.tight_layout()
        fig.savefig(out_dir / "attention_cosine_layer_step.png")
        plt.close(fig)
        figures.append({"file": "attention_cosine_layer_step.png", "title": "worst cosine by layer and step"})
    return figures
