"""The official sampler's aspect table (resolution name x aspect ratio -> size), against the sizes
OPENSORA.md §3 lists and the official `get_aspect_ratios_dict(training=False)` rule written here."""

from __future__ import annotations

import math

import pytest

from sagevideo.pipelines.opensora.aspect import aspect_table, image_size, official_sizes, size_problem

RATIOS = ["2.39:1", "2:1", "16:9", "1.85:1", "9:16", "5:8", "3:2", "4:3", "1:1"]


def official_rule(pixels: int) -> dict[str, tuple[int, int]]:
    """opensora/datasets/aspect.py at inference: each ratio computed, then every transpose written
    over the direct entries (so "16:9" is the transpose of "9:16")."""
    direct, vertical = {}, {}
    for ratio in RATIOS:
        a, b = map(float, ratio.split(":"))
        width = int(math.sqrt(pixels * (a / b)) // 16) * 16
        height = int((pixels / width) // 16) * 16
        direct[ratio] = (height, width)
        vertical[":".join(ratio.split(":")[::-1])] = (width, height)
    return {**direct, **vertical}


@pytest.mark.parametrize("resolution, pixels", [("256px", 256 * 256), ("768px", 768 * 768)])
def test_the_table_is_the_official_rule(resolution, pixels):
    table = aspect_table(resolution)
    assert table == official_rule(pixels)
    assert all(h % 16 == 0 and w % 16 == 0 for h, w in table.values())


def test_the_sizes_opensora_md_lists():
    assert image_size() == (192, 336)  # the official default: 256px, 16:9
    assert [image_size("256px", r) for r in ("16:9", "9:16", "1:1", "2.39:1")] == [
        (192, 336), (336, 192), (256, 256), (160, 384)]
    assert [image_size("768px", r) for r in ("16:9", "9:16", "1:1", "2.39:1")] == [
        (576, 1024), (1024, 576), (768, 768), (496, 1184)]
    assert official_sizes()[(576, 1024)] == ("768px", "16:9")


def test_unknown_names_say_what_there_is():
    with pytest.raises(KeyError, match=r"no '512px' resolution; use one of \['256px', '768px'\]"):
        image_size("512px")
    with pytest.raises(KeyError, match=r"no aspect ratio '21:9'; use one of \['2.39:1', '2:1'"):
        image_size("256px", "21:9")


def test_a_size_off_the_table_is_refused_with_the_nearest_ones():
    assert size_problem(192, 336) is None and size_problem(1184, 496) is None
    problem = size_problem(480, 848)
    assert problem.startswith("resolution: 848x480 is not a size of Open-Sora 2.0's official aspect table")
    assert "nearest in aspect: 336x192 (256px 16:9) or 1024x576 (768px 16:9)" in problem
