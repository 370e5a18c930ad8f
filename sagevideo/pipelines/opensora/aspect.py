"""The official Open-Sora 2.0 sampler's video sizes: resolution name x aspect ratio -> (height, width).

The sampler is given a resolution ("256px" or "768px": a pixel budget of 256² or 768²) and an
aspect ratio written width:height, and takes the size from its aspect table at inference
(`training=False`). For a ratio a:b and a budget P the table holds
    width  = floor(sqrt(P * a / b) / 16) * 16
    height = floor(P / width / 16) * 16
(16 = the VAE's 8x times the patch 2), for the ratios 2.39:1, 2:1, 16:9, 1.85:1, 9:16, 5:8, 3:2,
4:3, 1:1, and each ratio's transpose b:a with (width, height) swapped; a transpose replaces a
ratio computed directly under the same name (so "16:9" is the transpose of "9:16"'s entry: the
same 192x336 at 256px). OPENSORA.md §3 lists some of them: 16:9 192x336, 1:1 256x256, 2.39:1
160x384 at 256px; 16:9 576x1024, 1:1 768x768, 2.39:1 496x1184 at 768px (H x W).

No torch here: the job checks run on the driver.
"""

from __future__ import annotations

import math

RESOLUTIONS: dict[str, int] = {"256px": 256 * 256, "768px": 768 * 768}
RATIOS = ("2.39:1", "2:1", "16:9", "1.85:1", "9:16", "5:8", "3:2", "4:3", "1:1")  # width:height
MULTIPLE = 16  # VAE 8x times patch 2
DEFAULT_RESOLUTION, DEFAULT_RATIO = "256px", "16:9"  # the official configs' defaults


def _size(pixels: int, ratio: str) -> tuple[int, int]:
    a, b = (float(x) for x in ratio.split(":"))
    width = int(math.sqrt(pixels * (a / b)) // MULTIPLE) * MULTIPLE
    height = int((pixels / width) // MULTIPLE) * MULTIPLE
    return height, width


def aspect_table(resolution: str) -> dict[str, tuple[int, int]]:
    """{"W:H": (height, width)} of the official table at `resolution` ("256px" or "768px")."""
    if resolution not in RESOLUTIONS:
        raise KeyError(f"Open-Sora 2.0 has no {resolution!r} resolution; use one of {sorted(RESOLUTIONS)}")
    pixels = RESOLUTIONS[resolution]
    direct, transposed = {}, {}
    for ratio in RATIOS:
        height, width = _size(pixels, ratio)
        direct[ratio] = (height, width)
        transposed[":".join(reversed(ratio.split(":")))] = (width, height)
    return {**direct, **transposed}


def image_size(resolution: str = DEFAULT_RESOLUTION, ratio: str = DEFAULT_RATIO) -> tuple[int, int]:
    """(height, width) of the official sampler for a resolution and a width:height ratio."""
    table = aspect_table(resolution)
    if ratio not in table:
        raise KeyError(f"Open-Sora 2.0's {resolution} table has no aspect ratio {ratio!r}; use one of {list(table)}")
    return table[ratio]


def official_sizes() -> dict[tuple[int, int], tuple[str, str]]:
    """(height, width) -> (resolution, ratio) for every entry of both tables (first name wins)."""
    sizes: dict[tuple[int, int], tuple[str, str]] = {}
    for resolution in RESOLUTIONS:
        for ratio, size in aspect_table(resolution).items():
            sizes.setdefault(size, (resolution, ratio))
    return sizes


def size_problem(height: int, width: int) -> str | None:
    """Why (height, width) is not a size of the official table ('resolution: ...; use e.g. ...'), or None."""
    if (height, width) in official_sizes():
        return None
    want = width / height
    lines = []
    for resolution in RESOLUTIONS:
        table = aspect_table(resolution)
        ratio = min(table, key=lambda r: abs(table[r][1] / table[r][0] - want))
        h, w = table[ratio]
        lines.append(f"{w}x{h} ({resolution} {ratio})")
    every = "; ".join(f"{res}: {', '.join(landscape_sizes(res))} and their transposes" for res in RESOLUTIONS)
    return (
        f"resolution: {width}x{height} is not a size of Open-Sora 2.0's official aspect table (the model was "
        f"trained at those sizes only); nearest in aspect: {' or '.join(lines)}. The sizes (WxH): {every}"
    )


def landscape_sizes(resolution: str) -> list[str]:
    """'WxH' of the table's landscape and square sizes at `resolution`, widest first, each once."""
    sizes = sorted({(w, h) for h, w in aspect_table(resolution).values() if w >= h}, reverse=True)
    return [f"{w}x{h}" for w, h in sizes]
