"""The official sampler's prompt text (no torch, no diffusers: the job checks count its tokens on the driver)."""

from __future__ import annotations

import re

_ENDS_WITH_FPS = re.compile(r"\d+ FPS\.$")


def add_prompt_suffixes(prompt: str, fps: int | None, motion_score: int | None) -> str:
    """The official sampler's prompt text. With `fps`: stripped, ended with a period, then
    " {fps} FPS." unless it already ends in "N FPS."; with `motion_score`: " {motion_score} motion score.".
    "a cat playing piano" -> "a cat playing piano. 24 FPS. 4 motion score."."""
    if fps is not None:
        prompt = prompt.strip()
        if not prompt.endswith("."):
            prompt += "."
        if not _ENDS_WITH_FPS.search(prompt):
            prompt = f"{prompt} {fps} FPS."
    if motion_score is not None:
        prompt = f"{prompt} {motion_score} motion score."
    return prompt
