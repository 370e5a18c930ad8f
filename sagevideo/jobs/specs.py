"""Generation job specs: what one video is (`JobSpec`), the value types its fields share with
`sagevideo.jobs.config.GenerateConfig` (how a batch runs), and problem formatting.

Both are pydantic models with `extra="forbid"`, so YAML/TOML job files (`sagevideo.jobs.files`) get
the same checks and error messages as the CLI and the Python API. Validation problems are raised
as `InputError` with one line per problem that names the field (and, for job files, the line)
and says what to give instead.
"""

from __future__ import annotations

import difflib
import os
import re
import unicodedata
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Annotated, Any

from pydantic import (
    AllowInfNan,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from sagevideo.choices import PV, Attention
from sagevideo.errors import InputError
from sagevideo.jobs.bounds import capped
from sagevideo.jobs.bounds import shown as shown_value

DEFAULT_PROMPTS = (
    "a red panda eating bamboo in a misty forest, cinematic lighting",
    "ocean waves crashing on black volcanic rocks at sunset, slow motion",
)
MAX_SEED = 2**63 - 1
# Output names given by the user are used as they are (no slug, no id suffix), so they must be a
# plain file name: no folder parts, no leading '.' or '-' (hidden files, options), nothing odd.
SAFE_OUTPUT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")




def _not_bool(value: Any) -> Any:
    # pydantic's lax mode reads true as 1; in a job file `steps: yes` is a mistake, not a 1.
    if isinstance(value, bool):
        raise ValueError(f"expected a number, got {str(value).lower()}")
    return value


NotBool = BeforeValidator(_not_bool)
# The value types of job fields, shared by JobSpec and GenerateConfig's job defaults (one declaration).
Seed = Annotated[int, NotBool, Field(ge=0, le=MAX_SEED)]
Frames = Annotated[int, NotBool, Field(ge=1, le=1024)]
Pixels = Annotated[int, NotBool, Field(ge=8, le=8192)]
Steps = Annotated[int, NotBool, Field(ge=1, le=1000)]
# AllowInfNan(False): a NaN fails every comparison, so `le` alone would call it "more than 100".
Guidance = Annotated[float, NotBool, AllowInfNan(False), Field(ge=0.0, le=100.0)]


class JobSpec(BaseModel):
    """One video to generate.

    height/width/frames/steps left as None take the model's defaults (tiny: 64x64 px, 9 frames,
    2 steps); `resolution="WIDTHxHEIGHT"` (or [width, height]) is another way to give both.
    attention/pv left as None take the batch's setting. plan: path of an attention-plan JSON
    (recorded in the manifest). image: path of the input image of an image-to-video model
    (`sagevideo.jobs.images`: known by its content's SHA-256, which is part of the job's id and
    recorded in the manifest with the path). name: optional name, sanitized and suffixed with
    the job id's start; output: exact output file stem (`<output>.mp4`), a plain file name that is refused,
    not rewritten, when unsafe. frames_png: also write every frame as a PNG into
    `<output stem>_frames/` (frame_00000.png, ...), committed together with the mp4.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    prompt: str = Field(description="text prompt")
    negative_prompt: str = ""
    seed: Seed = 0
    frames: Frames | None = None
    height: Pixels | None = None
    width: Pixels | None = None
    steps: Steps | None = None
    guidance: Guidance | None = None
    attention: Attention | None = None
    pv: PV | None = None
    plan: str | None = None
    image: str | None = None
    name: str | None = None
    output: str | None = None
    frames_png: bool = False

    @model_validator(mode="before")
    @classmethod
    def _split_resolution(cls, data: Any) -> Any:
        """resolution: "720x480" / [720, 480] (width first, as video sizes are written) -> width, height."""
        if not isinstance(data, Mapping) or "resolution" not in data:
            return data
        data = dict(data)
        value = data.pop("resolution")
        if value is None:
            return data
        if data.get("height") is not None or data.get("width") is not None:
            raise ValueError("resolution: give either resolution or height/width, not both")
        data["width"], data["height"] = parse_resolution(value)
        return data

    @field_validator("prompt")
    @classmethod
    def _prompt_not_blank(cls, value: str) -> str:
        value = value.strip()
        if not value:
            raise ValueError("prompt is empty; give some text to generate from")
        return value

    @field_validator("plan")
    @classmethod
    def _plan_not_blank(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("plan is empty; give the path of an attention-plan JSON or leave it out")
        return value

    @field_validator("image", mode="before")
    @classmethod
    def _image_path(cls, value: Any) -> Any:
        return os.fspath(value) if isinstance(value, os.PathLike) else value

    @field_validator("image")
    @classmethod
    def _image_not_blank(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("image is empty; give the path of an image file or leave it out")
        return value

    @field_validator("output")
    @classmethod
    def _safe_output(cls, value: str | None) -> str | None:
        if value is None:
            return None
        stem = value.removesuffix(".mp4")
        if not SAFE_OUTPUT.fullmatch(stem) or ".." in stem:
            raise ValueError(
                f"output {shown_value(value)} is not a plain file name; use ASCII letters (A-Z, a-z), digits, '.', "
                "'_' and '-' "
                "(no folders, no leading '.' or '-', at most 100 characters), e.g. 'shot-010'"
            )
        return stem


def parse_resolution(value: Any) -> tuple[int, int]:
    """"720x480", "720X480", "720*480" or [720, 480] -> (width, height); ValueError with the fix."""
    fix = "give WIDTHxHEIGHT in pixels, e.g. 720x480, or [720, 480]"
    if isinstance(value, str):
        match = re.fullmatch(r"\s*(\d+)\s*[xX*×]\s*(\d+)\s*", value)
        if not match:
            raise ValueError(f"resolution {shown_value(value)} is not WIDTHxHEIGHT; {fix}")
        return int(match[1]), int(match[2])
    if isinstance(value, (list, tuple)) and len(value) == 2 and all(
        isinstance(v, int) and not isinstance(v, bool) for v in value
    ):
        return value[0], value[1]
    raise ValueError(f"resolution {shown_value(value)} is not WIDTHxHEIGHT; {fix}")


def known_fields(model: str) -> list[str]:
    """Field names a user may write for a pydantic model of this module (by class name)."""
    if model == "JobSpec":
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


def job_problems(
    value: str | Mapping[str, Any] | JobSpec, defaults: Mapping[str, Any]
) -> tuple[JobSpec | None, list[tuple[str | None, str]]]:
    """A prompt string, a mapping of JobSpec fields (over `defaults`), or a JobSpec -> (job or None,
    [(field or None, problem line)]), without saying which job (see `collect_jobs`).

    Every field is checked: a bad `resolution` is reported beside the job's other problems,
    not instead of them."""
    if isinstance(value, JobSpec):
        return value, []
    if isinstance(value, str):
        fields = {**defaults, "prompt": value}
    elif isinstance(value, Mapping):
        fields = merge_fields(defaults, value)
    else:
        return None, [
            (None, f"expected a prompt string, a dict of job fields or a JobSpec, got {type(value).__name__}")
        ]
    fields, problems = split_resolution(fields)
    try:
        job = JobSpec(**fields)
    except ValidationError as err:
        problems += field_problems(err)
    if problems:
        return None, problems
    return job, []


def split_resolution(fields: Mapping[str, Any]) -> tuple[dict[str, Any], list[tuple[str | None, str]]]:
    """(fields with `resolution` turned into width/height, [(field, problem)]).

    JobSpec does the same split, but a model-level check stops pydantic from checking any other
    field; here a bad resolution is reported and left out so the rest is still checked."""
    fields = dict(fields)
    if "resolution" not in fields:
        return fields, []
    value = fields.pop("resolution")
    if value is None:
        return fields, []
    if fields.get("height") is not None or fields.get("width") is not None:
        return fields, [("resolution", "resolution: give either resolution or height/width, not both")]
    try:
        fields["width"], fields["height"] = parse_resolution(value)
    except ValueError as err:
        return fields, [("resolution", f"resolution: {err}")]
    return fields, []


def merge_fields(defaults: Mapping[str, Any], fields: Mapping[str, Any]) -> dict[str, Any]:
    """defaults overridden by fields; a resolution in `fields` also overrides default height/width
    and a height or width overrides a default resolution (they are two spellings of one setting)."""
    merged = dict(defaults)
    if fields.get("resolution") is not None:
        merged.pop("height", None)
        merged.pop("width", None)
    if any(fields.get(key) is not None for key in ("height", "width")):
        merged.pop("resolution", None)
    merged.update(fields)
    return merged


def collect_jobs(
    labelled: Iterable[tuple[Any, Any]], defaults: Mapping[str, Any]
) -> tuple[list[tuple[JobSpec, Any, Any]], list[tuple[str, str]]]:
    """Parse (item, label) pairs, e.g. (prompt, "prompts.txt line 3"): ([(job, label, item)] of the
    items that parse, [(where, problem)] of those that do not). A label may also be a job-file
    origin (see `where`), so that each problem names its line."""
    parsed, problems = [], []
    for value, label in labelled:
        job, found = job_problems(value, defaults)
        if job is not None:
            parsed.append((job, label, value))
        problems += [(where(label, field), line) for field, line in found]
    return parsed, problems


def read_text_file(path: str | Path, what: str, expected: str) -> str:
    """The UTF-8 text of a user's input file; InputError naming `what` it is when it cannot be read."""
    path = Path(path)
    if not path.exists():
        raise InputError(f"{what} {path} does not exist; give {expected}")
    if not path.is_file():
        raise InputError(f"{what} {path} is not a file; give {expected}")
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise InputError(
            f"{what} {path} is not UTF-8 text ({err.reason} at byte {err.start}); save it as UTF-8"
        ) from None
    except OSError as err:
        raise InputError(f"{what} {path} cannot be read: {err.strerror}") from None


# Lines of a YAML or TOML job file that no prompt starts with: a top-level section (`jobs:`,
# `{jobs: ...}`, `jobs = ...`), a TOML table header (`[defaults]`, `[[jobs]]`), a bare list's job
# (`- prompt: ...`). Read as prompts, each would become a video.
_JOB_FILE_LINE = re.compile(
    r"""^(\{\s*)?(?P<q>["']?)(recipe|defaults|jobs)(?P=q)\s*(:(\s|$)|=)"""
    r"""|^\s*\[\[?\s*(recipe|defaults|jobs)\s*\]\]?\s*(\#.*)?$"""
    r"""|^-\s+(?P<p>["']?)prompt(?P=p)\s*:(\s|$)"""
)


def read_prompts_file(path: str | Path) -> list[tuple[str, str]]:
    """Prompts of a text file, one per line; blank lines and lines starting with '#' are skipped.

    Returns (prompt, "FILE line N") pairs so that errors can point at the line. A file with lines
    that only a job file has (`_JOB_FILE_LINE`: `defaults: {steps: 2}`, `[[jobs]]`, ...) is
    refused: it is a job file under another extension (rename it), or its prompt needs rewording.
    """
    path = Path(path)
    text = read_text_file(path, "prompts file", "a text file with one prompt per line")
    prompts, structured = [], []
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            prompts.append((stripped, f"{path} line {number}"))
            if _JOB_FILE_LINE.match(line):
                structured.append((number, stripped))
    if structured:
        (number, line), more = structured[0], len(structured) - 1
        others = f" (and {more} more such line{'s' if more > 1 else ''})" if more else ""
        raise InputError(
            f"{path} line {number}: looks like a YAML/TOML job file ({shown_value(line)}{others}) but is read as one "
            "prompt per line, as any file not named .yaml/.yml/.toml is; if it is a job file, name it .yaml (or "
            ".toml), if these are prompts, put such a line in quotes"
        )
    if not prompts:
        raise InputError(
            f"prompts file {path} has no prompts (only blank or # lines); add one prompt per line"
        )
    return prompts


def slugify(text: str, max_len: int = 40) -> str:
    """Lowercase ASCII letters, digits and '-' only (never '/', '..' or a leading '.')."""
    ascii_text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode()
    slug = re.sub(r"[^a-z0-9]+", "-", ascii_text.lower()).strip("-")
    return slug[:max_len].rstrip("-") or "video"


def output_stem(job: JobSpec, jid: str) -> str:
    """File name stem for a job: its `output` as given (validated to be a plain file name), else
    the slug of its name (or prompt) + the first 10 digits of its id."""
    if job.output:
        return job.output
    return f"{slugify(job.name or job.prompt)}-{jid[:10]}"
