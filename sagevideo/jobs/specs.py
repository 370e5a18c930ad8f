"""Generation job specs: what one video is (`JobSpec`), the value types its fields share with
`sagevideo.jobs.config.GenerateConfig` (how a batch runs), parsing jobs from prompts and field
mappings (`collect_jobs`) and naming their files (problem formatting: `jobs.problems`; text
files: `jobs.text_files`).

Both are pydantic models with `extra="forbid"`, so YAML/TOML job files (`sagevideo.jobs.files`) get
the same checks and error messages as the CLI and the Python API. Validation problems are raised
as `InputError` with one line per problem that names the field (and, for job files, the line)
and says what to give instead.
"""

from __future__ import annotations

import os
import re
import unicodedata
from collections.abc import Iterable, Mapping
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
from sagevideo.errors import InputError  # noqa: F401 - many rooms import it from here
from sagevideo.jobs.bounds import shown as shown_value
from sagevideo.jobs.problems import field_problems, where
from sagevideo.jobs.sparse import SparseText

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
    attention/pv/sparse left as None take the batch's setting. plan: path of an attention-plan JSON
    (recorded in the manifest). sparse: block-sparse attention ("dynamic:0.15", "off":
    `sagevideo.jobs.sparse`). image: path of the input image of an image-to-video model
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
    sparse: SparseText | None = None
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
