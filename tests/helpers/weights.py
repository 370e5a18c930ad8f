"""Changing a saved model's weights the way a fine-tune written over its files does."""

from __future__ import annotations

from pathlib import Path


def rewrite_in_place(weights: Path) -> None:
    """The same tensors (names, dtypes, shapes: the same header and size), other values, same file."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(weights, "pt") as f:
        metadata = f.metadata()
        tensors = {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118 (safe_open is no dict)
    name = next(n for n, t in tensors.items() if t.is_floating_point() and t.numel() > 1)
    tensors[name] = tensors[name] + 0.5
    save_file(tensors, weights, metadata=metadata)
