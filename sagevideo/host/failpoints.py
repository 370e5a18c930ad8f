"""Named failpoints: test-only process deaths at a few places of the generation path.

A failpoint is armed by one environment variable (or `arm()`), and checked where it is named:

    SAGEVIDEO_FAILPOINTS="job-staged=KILL ONCE:1; mid-denoise=KILL:1@1"

Each entry is `POINT=RULE[,RULE...]`; a rule is `PROMPT_SUBSTRING[:TIMES][@RANK]`: it fires for a
job whose prompt contains the substring, on its first TIMES attempts (default 1), on rank RANK
(default: every rank; a plain worker is rank 0). Firing leaves the process at once (`os._exit`,
exit status `EXIT_CODE`): no cleanup, no exception, like a kill -9 or a segfault.

Points (checked by `sagevideo.host.pipeline_host.PipelineHost`):
- `job-staged`: right after a job's outputs are staged, before the driver commits them: a worker
  (or, without Ray, the driver) killed mid-batch;
- `mid-denoise`: at the job's second transformer call (its first if it has one step): a rank of a
  sequence-parallel group dying while its peers wait for it in a collective.

Worker processes get the driver's arming as a string (`armed()` -> `arm(spec)`), so a cluster that
does not share the driver's environment is armed as well.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

ENV = "SAGEVIDEO_FAILPOINTS"
EXIT_CODE = 87
POINTS = ("job-staged", "mid-denoise")

_UNSET = object()
_armed: object | str | None = _UNSET  # what arm() set; _UNSET: the environment decides


@dataclass(frozen=True)
class Rule:
    text: str
    times: int = 1
    rank: int | None = None

    def matches(self, prompt: str, attempt: int, rank: int) -> bool:
        return self.text in prompt and attempt <= self.times and self.rank in (None, rank)


def parse(spec: str | None) -> dict[str, tuple[Rule, ...]]:
    """Point -> rules of a spec (see the module docstring); ValueError names an unknown point."""
    points: dict[str, tuple[Rule, ...]] = {}
    for entry in (spec or "").split(";"):
        if not entry.strip():
            continue
        point, eq, rules = entry.strip().partition("=")
        point = point.strip()
        if not eq or point not in POINTS:
            raise ValueError(f"{ENV}: {entry.strip()!r} is not POINT=RULE with POINT one of {list(POINTS)}")
        points[point] = points.get(point, ()) + tuple(_rule(part) for part in rules.split(",") if part)
    return points


def _rule(part: str) -> Rule:
    text, at, rank = part.rpartition("@")
    if not (at and text and rank.isdigit()):
        text, rank = part, ""
    head, _, tail = text.rpartition(":")
    text, times = (head, int(tail)) if head and tail.isdigit() else (text, 1)
    return Rule(text, times, int(rank) if rank else None)


def arm(spec: str | None) -> None:
    """Arm this process with `spec` (None or "": nothing armed), whatever its environment says."""
    global _armed
    parse(spec)  # refuse a bad spec now, not at the first check
    _armed = spec or None


def disarm() -> None:
    """Back to the environment variable deciding."""
    global _armed
    _armed = _UNSET


def armed() -> str | None:
    """The spec in force here (from `arm`, else the environment), to hand to worker processes."""
    return os.environ.get(ENV) if _armed is _UNSET else _armed  # type: ignore[return-value]


def fires(point: str, prompt: str, attempt: int, rank: int = 0) -> bool:
    """Whether `point` is armed for a job with this prompt, attempt and rank."""
    if point not in POINTS:
        raise ValueError(f"unknown failpoint {point!r}; known: {list(POINTS)}")
    spec = armed()
    if not spec:
        return False
    return any(rule.matches(prompt, attempt, rank) for rule in parse(spec).get(point, ()))


def check(point: str, prompt: str, attempt: int, rank: int = 0) -> None:
    """Leave the process now when `point` fires (see `fires`)."""
    if fires(point, prompt, attempt, rank):
        exit_now()


def exit_now() -> None:
    """Leave the process at once: no cleanup, no exception."""
    os._exit(EXIT_CODE)
