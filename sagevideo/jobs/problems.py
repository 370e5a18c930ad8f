"""How input problems are said: a validation error's parts (field, what is wrong, the value), the
option a run setting is given by ('--steps 0'), the place of a job's field ('FILE line N (job K)'),
and one line per distinct problem (`group_problems`), for every room that checks user input."""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import Any

from pydantic import ValidationError

from sagevideo.errors import InputError
from sagevideo.jobs.bounds import capped
from sagevideo.jobs.bounds import shown as shown_value


def known_fields(model: str) -> list[str]:
    """Field names a user may write for a pydantic model of `jobs` (by class name: JobSpec, GenerateConfig)."""
    if model == "JobSpec":
        from sagevideo.jobs.specs import JobSpec

        return [*JobSpec.model_fields, "resolution"]
    if model == "GenerateConfig":
        from sagevideo.jobs.config import GenerateConfig

        return list(GenerateConfig.model_fields)
    return []


def field_problems(err: ValidationError) -> list[tuple[str, str]]:
    """(field, '<field>: <what is wrong> (got <value>)') per problem, with a fix where one is known."""
    return [(field, f"{field}: {msg}{shown}") for field, msg, shown in problem_parts(err)]


def problem_parts(err: ValidationError) -> list[tuple[str, str, str]]:
    """(field, what is wrong, ' (got <value>)' or '') per problem of a validation error."""
    problems = []
    for problem in err.errors():
        field = ".".join(str(part) for part in problem["loc"])
        msg = problem["msg"].removeprefix("Value error, ")
        got = problem.get("input")
        shown = "" if problem["type"] in ("missing", "extra_forbidden") else f" (got {shown_value(got)})"
        if not field:  # model-level check: the only one is JobSpec's resolution split
            field = "resolution" if msg.startswith("resolution") else "value"
            msg, shown = msg.removeprefix("resolution: "), ""  # the input is the whole job
        if problem["type"] == "extra_forbidden":
            msg = "unknown field; remove it or check its spelling"
            close = difflib.get_close_matches(field, known_fields(err.title), n=1, cutoff=0.6)
            if close:
                msg += f" (did you mean {close[0]!r}?)"
        elif problem["type"] == "missing":
            msg = f"missing; every job needs a {field}" if field == "prompt" else "missing; add it"
        problems.append((field, msg, shown))
    return problems


def option_name(field: str) -> str:
    """The command-line option of a job field or run setting: negative_prompt -> --negative-prompt."""
    return "--" + field.replace("_", "-")


# Options that are on/off flags on the command line (--frames-png/--no-frames-png).
FLAG_OPTIONS = ("frames_png", "progress", "attention_probe", "noise_floor")


def option_place(field: str, value: Any) -> str:
    """Where a problem of an option's value is: '--steps 0' (the flag for on/off options)."""
    if isinstance(value, bool) and field in FLAG_OPTIONS:
        return option_name(field) if value else f"--no-{field.replace('_', '-')}"
    return f"{option_name(field)} {value}"


def value_problems(err: ValidationError) -> list[tuple[str, str, str]]:
    """(field, option with its value, what is wrong) per problem of a validation error of options."""
    return [(field.split(".", 1)[0], option_place(field, got), msg) for field, msg, got in _parts_with_input(err)]


def options_error(err: ValidationError) -> InputError:
    """One InputError naming every bad option of a config's validation error at once
    ('--steps 0: ...', grouped as `group_problems` says them)."""
    return InputError(group_problems([(place, text) for _, place, text in value_problems(err)]))


def _parts_with_input(err: ValidationError) -> list[tuple[str, str, Any]]:
    inputs = {".".join(str(part) for part in e["loc"]): e.get("input") for e in err.errors()}
    return [(field, msg, inputs.get(field)) for field, msg, _ in problem_parts(err)]


def group_problems(problems: Iterable[tuple[str, str]]) -> str:
    """(where, problem) pairs -> one line per distinct problem, listing where it occurs.

    A bad batch-wide option (e.g. --frames 8) then reads as one line, not one per prompt; a bad
    value in a job file's defaults reads as one line at the defaults' line. At most
    `bounds.MAX_PROBLEM_LINES` lines, then one saying how many more.
    """
    grouped: dict[str, list[str]] = {}
    for where, problem in problems:
        places = grouped.setdefault(problem, [])
        if where not in places:
            places.append(where)
    lines = []
    for problem, places in grouped.items():
        shown = ", ".join(places[:3]) + (f" and {len(places) - 3} more" if len(places) > 3 else "")
        lines.append(f"{shown}: {problem}" if shown else problem)  # "": a problem that names its own place
    return "\n".join(capped(lines))


def where(label: Any, field: str | None = None) -> str:
    """The place to name in an error about `field` of a job with this label.

    Labels are strings ("job 2", "prompts.txt line 3") or objects with `.at(field)` (job-file
    origins, which know the line of each field).
    """
    at = getattr(label, "at", None)
    return at(field) if at is not None else str(label)
