"""Generation job specs: what one video is (`JobSpec`) and how a batch runs (`RunSettings`).

Both are pydantic models with `extra="forbid"`, so a later YAML/TOML job file gets the same
checks and error messages as the CLI and the Python API. Validation problems are raised as
`InputError` with one line per problem that names the field and says what to give instead.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import unicodedata
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

DEFAULT_PROMPTS = (
    "a red panda eating bamboo in a misty forest, cinematic lighting",
    "ocean waves crashing on black volcanic rocks at sunset, slow motion",
)
MAX_SEED = 2**63 - 1


class InputError(ValueError):
    """Bad user input found before any model is loaded; the message is ready to print."""


class JobSpec(BaseModel):
    """One video to generate.

    height/width/frames/steps left as None take the model's defaults (tiny: 64x64 px, 9 frames,
    2 steps). name: optional output name; it is sanitized and suffixed with the job id's start.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    prompt: str = Field(description="text prompt")
    negative_prompt: str = ""
    seed: int = Field(0, ge=0, le=MAX_SEED)
    frames: int | None = Field(None, ge=1, le=1024)
    height: int | None = Field(None, ge=8, le=8192)
    width: int | None = Field(None, ge=8, le=8192)
    steps: int | None = Field(None, ge=1, le=1000)
    guidance: float = Field(6.0, ge=0.0, le=100.0)
    name: str | None = None

    @field_validator("prompt")
    @classmethod
    def _prompt_not_blank(cls, value: str) -> str:
        value = value.strip()
        if not value:
            raise ValueError("prompt is empty; give some text to generate from")
        return value

    @field_validator("guidance")
    @classmethod
    def _finite(cls, value: float) -> float:
        if not math.isfinite(value):
            raise ValueError("guidance must be a finite number, e.g. 6.0")
        return value


class RunSettings(BaseModel):
    """Settings shared by every job of a batch.

    model: "tiny" (built in) or a local diffusers folder. attention: "sage" installs sagevideo's
    processor, "full" runs the stock full-precision one. backend: `sageattn`'s backend; "auto" on
    a CPU device means "reference" (see `sagevideo.api.generate`). dtype: None = bf16 on CUDA, fp32 on CPU.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str = "tiny"
    attention: Literal["sage", "full"] = "sage"
    pv: Literal["fp16", "fp8"] = "fp16"
    backend: Literal["auto", "triton", "reference", "sdpa"] = "auto"
    device: Literal["auto", "cpu", "cuda"] = "auto"
    dtype: Literal["float32", "bfloat16", "float16"] | None = None
    fps: int = Field(8, ge=1, le=240)


def validation_problems(err: ValidationError) -> list[str]:
    """One '<field>: <what is wrong> (got <value>)' per problem."""
    lines = []
    for problem in err.errors():
        field = ".".join(str(part) for part in problem["loc"]) or "value"
        msg = problem["msg"].removeprefix("Value error, ")
        if problem["type"] == "extra_forbidden":
            msg = "unknown field; remove it or check its spelling"
        got = problem.get("input")
        shown = "" if problem["type"] in ("missing", "extra_forbidden") else f" (got {got!r})"
        lines.append(f"{field}: {msg}{shown}")
    return lines


def validation_message(err: ValidationError, where: str) -> str:
    """One line per problem: '<where>: <field>: <what is wrong> (got <value>)'."""
    return "\n".join(f"{where}: {line}" for line in validation_problems(err))


def group_problems(problems: Iterable[tuple[str, str]]) -> str:
    """(where, problem) pairs -> one line per distinct problem, listing where it occurs.

    A bad batch-wide option (e.g. --frames 8) then reads as one line, not one per prompt.
    """
    grouped: dict[str, list[str]] = {}
    for where, problem in problems:
        grouped.setdefault(problem, []).append(where)
    lines = []
    for problem, places in grouped.items():
        shown = ", ".join(places[:3]) + (f" and {len(places) - 3} more" if len(places) > 3 else "")
        lines.append(f"{shown}: {problem}")
    return "\n".join(lines)


def parse_job(value: str | Mapping[str, Any] | JobSpec, defaults: Mapping[str, Any]) -> JobSpec:
    """A prompt string, a mapping of JobSpec fields, or a JobSpec -> JobSpec.

    `defaults` fill fields a string or mapping does not set; a JobSpec is taken as it is.
    Raises InputError with one line per problem (without saying which job: see parse_jobs).
    """
    if isinstance(value, JobSpec):
        return value
    if isinstance(value, str):
        fields = {**defaults, "prompt": value}
    elif isinstance(value, Mapping):
        fields = {**defaults, **value}
    else:
        raise InputError(
            f"expected a prompt string, a dict of job fields or a JobSpec, got {type(value).__name__}"
        )
    try:
        return JobSpec(**fields)
    except ValidationError as err:
        raise InputError("\n".join(validation_problems(err))) from None


def parse_jobs(labelled: Iterable[tuple[Any, str]], defaults: Mapping[str, Any]) -> list[JobSpec]:
    """Parse (item, label) pairs, e.g. (prompt, "prompts.txt line 3"); all problems in one InputError."""
    jobs, problems = [], []
    for value, label in labelled:
        try:
            jobs.append(parse_job(value, defaults))
        except InputError as err:
            problems += [(label, line) for line in str(err).splitlines()]
    if problems:
        raise InputError(group_problems(problems))
    if not jobs:
        raise InputError("no prompts to generate; give at least one")
    return jobs


def read_prompts_file(path: str | Path) -> list[tuple[str, str]]:
    """Prompts of a text file, one per line; blank lines and lines starting with '#' are skipped.

    Returns (prompt, "FILE line N") pairs so that errors can point at the line.
    """
    path = Path(path)
    if not path.exists():
        raise InputError(f"prompts file {path} does not exist; give a text file with one prompt per line")
    if not path.is_file():
        raise InputError(f"prompts file {path} is not a file; give a text file with one prompt per line")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise InputError(
            f"prompts file {path} is not UTF-8 text ({err.reason} at byte {err.start}); save it as UTF-8"
        ) from None
    except OSError as err:
        raise InputError(f"prompts file {path} cannot be read: {err.strerror}") from None
    prompts = []
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            prompts.append((stripped, f"{path} line {number}"))
    if not prompts:
        raise InputError(
            f"prompts file {path} has no prompts (only blank or # lines); add one prompt per line"
        )
    return prompts


def job_id(job: JobSpec, settings: Mapping[str, Any]) -> str:
    """Stable 16-hex-digit id of a job under the settings that change its output."""
    payload = json.dumps(
        {"job": job.model_dump(), "settings": dict(settings)}, sort_keys=True, ensure_ascii=True
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def slugify(text: str, max_len: int = 40) -> str:
    """Lowercase ASCII letters, digits and '-' only (never '/', '..' or a leading '.')."""
    ascii_text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode()
    slug = re.sub(r"[^a-z0-9]+", "-", ascii_text.lower()).strip("-")
    return slug[:max_len].rstrip("-") or "video"


def output_stem(job: JobSpec, jid: str) -> str:
    """File name stem for a job: slug of its name (or prompt) + the first 10 digits of its id."""
    return f"{slugify(job.name or job.prompt)}-{jid[:10]}"
