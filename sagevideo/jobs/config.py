"""`GenerateConfig`: every option of a generation batch, declared once.

Each field is one option: its name (the keyword of `sagevideo.generate` and `plan_batch`; the
CLI flag is `--<name with dashes>`), type, default, help (the field's description, also the CLI
help) and validation. The CLI's `sagevideo generate` options are generated from these fields
(`sagevideo.cli.generate`), the Python API validates its keyword arguments with them, and a job
file's `defaults:` layer over the fields that are also job fields (`JOB_DEFAULTS`): a job's own
value > its file's defaults > these options > the model's defaults.

`GenerateConfig(...)` validates as pydantic does (ValidationError). `GenerateConfig.build(...)`,
which the API and the CLI use, never raises for a bad value: the value is left at its default and
the problem kept in `config.problems` ((field, option with value, what is wrong)), so that
`plan_batch` lists it beside every other problem of the batch, each once. Unknown or missing
keywords raise TypeError, as for any Python call.

The options that several commands take are declared once here as groups the configs inherit, as
the recipe's are (`sagevideo.jobs.recipe.RecipeOptions`): `DeviceOptions` (where a run happens:
generate, ab, eval, calibrate, profile, bench) and `RunOptions` (the model, its input image and the
progress bar, with the device: generate, ab, calibrate); `sagevideo.jobs.sparse.SparseOptions`
(`--sparse`) is a group of its own (generate, ab, calibrate).
"""

from __future__ import annotations

import difflib
import inspect
import math
import types
import typing
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PrivateAttr, ValidationError

from sagevideo.choices import Attention, AttentionGuard, Backend, Device, DType, PVChoice
from sagevideo.errors import InputError
from sagevideo.jobs.problems import group_problems, value_problems
from sagevideo.jobs.recipe import RecipeOptions, expand_recipe
from sagevideo.jobs.sparse import SparseOptions
from sagevideo.jobs.specs import Frames, Guidance, JobSpec, NotBool, Pixels, Seed, Steps


def _whole_number(fix: str):
    """A before-validator: a whole number >= 1 (not a bool, not a string), else `fix`."""

    def check(value: Any) -> Any:
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(fix)
        return value

    return BeforeValidator(check)


def _seconds(value: Any) -> Any:
    if value is not None and (
        isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf
    ):
        raise ValueError("give seconds > 0, e.g. 1800 (leave it out for no limit)")
    return value


def _listed(value: Any) -> Any:
    """Prompts or jobs: one item, or any iterable of items, kept as a list (a generator is read once)."""
    if value is None or isinstance(value, (str, Path, Mapping, JobSpec)):
        return value
    if isinstance(value, Iterable):
        return list(value)
    return value


class DeviceOptions(BaseModel):
    """Where a run happens, declared once for every command that takes it."""

    device: Device = Field("auto", description="Where it runs: auto = CUDA when available, else CPU.")


class RunOptions(DeviceOptions):
    """The model a run loads, its input image, where it runs and its progress bar: the options
    generate, ab and calibrate share (each inherits them)."""

    model: str = Field("tiny", description="'tiny' (built in, no download) or a local diffusers folder.")
    image: Path | None = Field(
        None,
        description="Input image of image-to-video models (e.g. --model tiny-cogvideox-i2v) for the jobs (prompts) "
        "that name none, the same in every arm of ab: resized to the job's resolution when the aspect ratios match, "
        "else refused; recorded in the manifest with its SHA-256.",
    )
    progress: bool = Field(True, description="Show the progress bar.")


class GenerateConfig(RunOptions, RecipeOptions, SparseOptions):
    """Every option of a batch (see the module docstring); the fields are in the CLI's order: its
    own, then the shared run options (`RunOptions`), then the recipe's (`RecipeOptions`) and the
    block-sparse setting (`SparseOptions`: `--sparse`, also a job field) in their own help panels.
    `COMMAND_LINE` says how the command line spells the fields that are not plain `--<name>` options.

    plan: an attention-plan JSON for every job that names none (checked to exist and fit the
    model, recorded in the manifest with its hash). image: the input image of every job that
    names none, for image-to-video models (`sagevideo.jobs.images`; checked before loading).
    gpus_per_job: ranks per job (Ulysses sequence parallelism, the families that split), checked against
    every job's heads and video tokens by `plan_batch`. job_timeout: seconds one job may run. On
    Ray the driver stops a worker whose job runs longer (a hang) and retries the job like a worker
    death; in this process a timer stops the job at the limit, mid-step, between two torch
    operations (one operation that runs longer, e.g. a single huge attention call, finishes first;
    outside the main thread the limit is checked after each step), and the job fails.
    compile, compile_backend, linear, linear_keep, cache, cache_threshold (`RecipeOptions`): the
    batch's `Recipe` (`sagevideo.jobs.recipe`; `recipe=` in `build` gives them as one object, a job
    file's `recipe:` section where they are left at their defaults), applied once per loaded
    pipeline and checked against the machine by `plan_batch`.
    frames_png: default of the jobs' `frames_png` (PNG frames beside each mp4). dtype: None =
    bfloat16 on CUDA, float32 on CPU. progress: the progress bar of `generate` (planning ignores it).
    """

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)

    job_file: Path | None = Field(
        None,
        description="Job file: .yaml/.yml or .toml (recipe: the batch's speed recipe; defaults: and jobs: with "
        "per-job prompt, negative_prompt, "
        "seed, frames, resolution, steps, guidance, attention, pv, plan, image, output, frames_png), or any other file "
        "as plain text, one prompt per line (blank lines and # comments are skipped).",
    )
    out: Path = Field(description="Output folder for the mp4 files and manifest.jsonl.")
    prompts_or_jobs: Annotated[Any, BeforeValidator(_listed)] = Field(
        None,
        description="A prompt (repeatable). Without prompts: a built-in batch of two. (In Python also a job file: "
        "a Path, or a one-word string ending in .yaml/.yml/.toml/.txt; a dict of JobSpec fields, a JobSpec, or a "
        "list of those.)",
    )
    prompts_file: Path | None = Field(None, description="A text file with one prompt per line.")
    negative_prompt: str = Field("", description="Negative prompt for every job.")
    seed: Seed = Field(0, description="Seed of the initial noise (CPU generator: same on every device).")
    frames: Frames | None = Field(None, description="Frames, 1 + 8k (default: the model's; tiny: 9).")
    height: Pixels | None = Field(None, description="Height in px, multiple of 16 (default: the model's; tiny: 64).")
    width: Pixels | None = Field(None, description="Width in px, multiple of 16 (default: the model's; tiny: 64).")
    steps: Steps | None = Field(None, description="Denoising steps (default: tiny 2, local models 50).")
    guidance: Guidance | None = Field(
        None, description="Classifier-free guidance scale (<= 1 disables it; default: the model's, CogVideoX 6)."
    )
    attention: Attention = Field("sage", description="sage: quantized attention; full: stock full precision.")
    backend: Backend = Field(
        "auto", description="sageattn backend; auto = Triton on CUDA, the emulation (reference) on CPU."
    )
    pv: PVChoice = Field(
        "auto",
        description="Precision of the P·V product; auto = FP8 on GPUs with FP8 tensor cores (sm89+), else FP16.",
    )
    attention_guard: AttentionGuard = Field(
        "warn",
        description="Attention past INT8's accuracy (counted on the GPU, read after each forward, recorded per "
        "layer in the manifest): warn once per layer; full = rerun those layers in full precision from then on; "
        "fail = fail the job naming them.",
    )
    plan: Path | None = Field(
        None, description="Attention-plan JSON for jobs that name none (checked, recorded in the manifest)."
    )
    dtype: DType | None = Field(None, description="Model dtype (default: bfloat16 on CUDA, float32 on CPU).")
    fps: Annotated[int, NotBool, Field(ge=1, le=240)] | None = Field(
        None, description="Frame rate of the mp4 files (default: the model's, the rate it was trained at)."
    )
    address: str | None = Field(
        None,
        description="Run on Ray: 'auto' (this machine's cluster, else a local instance) or the head's HOST:PORT. "
        "Without it, Ray is used only for --workers > 1 or several visible GPUs.",
    )
    workers: Annotated[int | None, _whole_number("give a whole number >= 1 (1 runs in this process)")] = Field(
        None, description="Ray workers, each loading the model once (default: one per GPU; 1 = this process)."
    )
    gpus_per_job: Annotated[
        int, _whole_number("give a whole number >= 1 (1: one GPU per job, no splitting)")
    ] = Field(
        1,
        description="Split each job over N GPUs of one node (Ulysses sequence parallelism: CogVideoX, Open-Sora 2.0, "
        "Wan, HunyuanVideo; N must divide the model's attention heads and each job's video tokens; Ray groups of N "
        "ranks, --workers counts groups). With --device cpu: N CPU processes (gloo).",
    )
    max_attempts: Annotated[int, _whole_number("give a whole number >= 1 (1: no retry)")] = Field(
        3, description="Runs of a job whose worker died (killed, CUDA error, OOM) before it fails."
    )
    job_timeout: Annotated[float | None, BeforeValidator(_seconds)] = Field(
        None,
        description="Seconds one job may run. On Ray a job still running then has its worker stopped and is "
        "retried (a hang); in this process it is stopped mid-step (between two torch operations) and fails.",
    )
    frames_png: bool = Field(
        False, description="Also write each job's frames as PNGs into <output>_frames/ (job files: frames_png)."
    )

    _problems: list[tuple[str, str, str]] = PrivateAttr(default_factory=list)

    @property
    def problems(self) -> list[tuple[str, str, str]]:
        """(field, option with its value, what is wrong) for each value `build` left at its default,
        and settings of the recipe that contradict each other."""
        return [*self._problems, *self.recipe.problems()]

    @property
    def bad_values(self) -> list[tuple[str, str, str]]:
        """`problems` without the recipe's contradictions: the values `build` left at their defaults."""
        return list(self._problems)

    @classmethod
    def build(cls, prompts_or_jobs: Any = None, /, **options: Any) -> GenerateConfig:
        """A config from a GenerateConfig (with `options` over it) or from prompts/jobs and keyword
        options; bad values are kept in `problems`, not raised (see the module docstring)."""
        options = expand_recipe(options)  # recipe=Recipe(...) -> its flat fields
        if isinstance(prompts_or_jobs, GenerateConfig):
            base, data = prompts_or_jobs, {**dict(prompts_or_jobs), **options}
        else:
            base, data = None, dict(options)
            if prompts_or_jobs is not None:
                data["prompts_or_jobs"] = prompts_or_jobs
        unknown = [name for name in data if name not in cls.model_fields]
        if unknown:
            close = difflib.get_close_matches(unknown[0], list(cls.model_fields), n=1, cutoff=0.6)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise TypeError(f"unexpected keyword argument {unknown[0]!r}{hint}")
        if "out" not in data:
            raise TypeError("missing the keyword argument 'out' (the output folder)")
        problems = [p for p in base._problems if p[0] not in options] if base is not None else []
        try:
            config = cls(**data)
        except ValidationError as err:
            found = value_problems(err)
            bad = {field for field, _, _ in found}
            if "out" in bad:  # nothing can be planned without the folder
                raise InputError(group_problems([(place, text) for _, place, text in found])) from None
            problems += found
            config = cls(**{k: v for k, v in data.items() if k not in bad})
        config._problems = problems
        return config

    def job_defaults(self) -> dict[str, Any]:
        """The options that are also job fields, as job-field values (a plan path made absolute):
        the layer under a job file's `defaults:` and each job's own fields."""
        values = {name: getattr(self, name) for name in JOB_DEFAULTS}
        for name in ("plan", "image"):
            if values[name] is not None:
                values[name] = str(Path(values[name]).expanduser().resolve())
        return values

    @classmethod
    def default(cls, name: str) -> Any:
        """The declared default of option `name`."""
        return cls.model_fields[name].default


# How the command line spells some fields (`sagevideo generate` and the torchrun launcher alike; see
# `sagevideo.cli.common.config_parameters` for the keys); every other field is `--<name-with-dashes>`.
COMMAND_LINE: dict[str, dict[str, Any]] = {
    "job_file": {"argument": True},
    "out": {"flags": ("--out", "-o")},
    "prompts_or_jobs": {"flags": ("--prompt", "-p"), "type": list[str]},
    "frames_png": {"flags": ("--frames-png/--no-frames-png",)},
    "progress": {"flags": ("--progress/--no-progress",)},
}
API_ONLY: tuple[str, ...] = ("prompts_file", "dtype")  # Python-only: a job file or --prompt give prompts there

def option_type(annotation: Any) -> Any:
    """The type a command line parses for a field's annotation (e.g. `Seed` -> int, `Path | None`
    -> Path): Annotated metadata and None dropped. TypeError for a union of several types."""
    while True:
        origin = typing.get_origin(annotation)
        if origin is Annotated:
            annotation = typing.get_args(annotation)[0]
        elif origin in (typing.Union, types.UnionType):
            args = [a for a in typing.get_args(annotation) if a is not type(None)]
            if len(args) != 1:
                raise TypeError(f"no command-line type for {annotation!r}")
            annotation = args[0]
        else:
            return annotation


def options_in_order(config: type[BaseModel]) -> list[tuple[str, Any]]:
    """(name, field) of a config's fields in a command line's order: its own in their order, then
    those it inherits from shared groups (pydantic would list them first), nearest group first
    (method resolution order), the groups with a help panel (`RecipeOptions`) last."""
    fields = config.model_fields
    own = inspect.get_annotations(config)
    order: list[str] = []
    for base in config.__mro__:
        order += [name for name in inspect.get_annotations(base) if name in fields and name not in order]
    return sorted(((name, fields[name]) for name in order),
                  key=lambda item: item[0] not in own and option_panel(config, item[0]) is not None)


def option_panel(config: type, name: str) -> str | None:
    """The help panel of a field: the `cli_panel` of the class that declares it (a shared group's)."""
    for base in config.__mro__:
        if name in inspect.get_annotations(base):
            return vars(base).get("cli_panel")
    return None


# Options that are also job fields: a job file (and a job's own fields) override them.
JOB_DEFAULTS: tuple[str, ...] = tuple(
    name for name in GenerateConfig.model_fields if name in JobSpec.model_fields and name != "prompt"
)
