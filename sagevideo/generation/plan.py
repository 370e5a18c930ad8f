"""Plan a batch of video jobs without loading a model: every input problem is found here.

`plan_batch(config)` takes a `GenerateConfig` (or prompts/jobs and keyword options, which build
one) and validates prompts or a job file (YAML/TOML/text), settings, model folder, attention-plan
files and output folder, resolves model defaults, the device, each job's attention backend and
where the batch runs (this process, or Ray), and gives each job a stable id and output name. It
returns a `BatchPlan` for `sagevideo.generation.run.run_batch`, or raises `InputError` naming
each bad field and its fix.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sagevideo.choices import resolve_device, resolve_pv
from sagevideo.errors import InputError
from sagevideo.host.pipeline_host import PlannedJob, RunContext
from sagevideo.jobs.config import JOB_DEFAULTS, GenerateConfig
from sagevideo.jobs.files import Origin
from sagevideo.jobs.identity import JobIdentity
from sagevideo.jobs.recipe import RECIPE_FIELDS
from sagevideo.jobs.specs import (
    DEFAULT_PROMPTS,
    JobSpec,
    collect_jobs,
    group_problems,
    option_place,
    output_stem,
    read_prompts_file,
    where,
)
from sagevideo.outputs.encoder import encoder_problem
from sagevideo.outputs.manifest import MANIFEST_NAME
from sagevideo.pipelines.loading import ModelSource

PromptsOrJobs = (
    str | Path | Mapping[str, Any] | JobSpec | Iterable[str | Mapping[str, Any] | JobSpec] | None
)

__all__ = ["BatchPlan", "GenerateConfig", "PromptsOrJobs", "check_images", "check_plans", "plan_batch", "resolve_pv"]


@dataclass
class BatchPlan:
    """Everything `run_batch` needs; built by `plan_batch` without loading any model.

    settings: the batch's `GenerateConfig`, with pv resolved ("auto" -> fp8/fp16 for the device).
    backend: the `sageattn` backend of the batch's default attention/pv, or None for "full"
    (each PlannedJob has its own). notes: facts the user should see before the run (e.g. why CPU
    runs the emulation). use_ray: run on Ray workers (`address`: None = a local instance, "auto",
    or HOST:PORT; `workers`: None = one per GPU, or per node on CPU). max_attempts: runs of a job
    whose worker died before it is marked failed. gpus_per_job: ranks that share each job by
    sequence parallelism (> 1: Ray groups of that many ranks; `workers` then counts groups).
    job_timeout: seconds a job may run (None: no limit); see `GenerateConfig.job_timeout`.
    """

    out: Path
    settings: GenerateConfig
    source: ModelSource
    device: str
    dtype: str
    backend: str | None
    jobs: list[PlannedJob]
    notes: list[str] = field(default_factory=list)
    use_ray: bool = False
    address: str | None = None
    workers: int | None = None
    max_attempts: int = 3
    gpus_per_job: int = 1
    job_timeout: float | None = None

    @property
    def manifest_path(self) -> Path:
        return self.out / MANIFEST_NAME

    def context(self) -> RunContext:
        """What each worker needs (no jobs)."""
        return RunContext(
            out=self.out, source=self.source, device=self.device, dtype=self.dtype, fps=self.settings.fps,
            recipe=self.settings.recipe, attention_guard=self.settings.attention_guard,
        )


def plan_batch(
    config: GenerateConfig | PromptsOrJobs = None, /, *, use_file_recipe: bool = True, ab_arm: bool = False,
    **options: Any,
) -> BatchPlan:
    """Validate a batch and resolve everything about it without loading a model.

    config: a `GenerateConfig`, or the prompts/jobs of one whose other options are the keyword
    arguments (`options` also override a given config's). Every option is a field of
    `GenerateConfig`, with its default and meaning. frames/height/width/steps left as None take
    the model's defaults. Precedence of job fields: a job's own value > a job file's `defaults` >
    these options > the model's defaults. Jobs whose estimated peak memory exceeds what the device
    has free are refused with the estimate (`sagevideo.generation.estimate`); large CPU jobs get a
    note with their measured attention time.
    A job file's `recipe:` section gives the recipe options the config leaves at their defaults
    (`sagevideo.jobs.recipe.layer_recipe`; a different value in both is an error naming both
    places); the resolved recipe is what is checked, recorded and part of the job ids.
    use_file_recipe: False plans without that section (`sagevideo ab`'s full-precision arms run
    plain; its values are still checked).
    ab_arm: True when `sagevideo ab` plans one of its arms; any other run is refused an --out that
    an ab run marked (`sagevideo.outputs.folders.ab_folder_problem`).
    Raises InputError naming each bad field and its fix (bad options among them, each once).
    """
    from sagevideo.jobs.files import load_job_file, looks_like_job_file
    from sagevideo.pipelines.families import degree_problems
    from sagevideo.pipelines.loading import resolve_model
    from sagevideo.pipelines.recipe import recipe_problems

    config = GenerateConfig.build(config, **options)
    prompts_or_jobs, job_file = config.prompts_or_jobs, config.job_file
    if job_file is None and looks_like_job_file(prompts_or_jobs):
        job_file, prompts_or_jobs = Path(prompts_or_jobs), None
    loaded = load_job_file(job_file) if job_file is not None else None
    # Every problem is collected before anything is refused: a bad option, a bad default of the
    # job file and each job's own problems are listed together, each once.
    problems: list[tuple[str, str]] = [(place, text) for _, place, text in config.bad_values]
    bad = {name for name, _, _ in config.bad_values}
    problems += loaded.problems if loaded is not None else []
    encoder = encoder_problem()  # without one, every job would render and then fail at the write
    if encoder:
        problems.append(("", encoder))
    recipe = _BatchRecipe.of(config, loaded.recipe if loaded is not None and use_file_recipe else None, bad)
    config = config.model_copy(update=recipe.recipe.model_dump())
    problems += recipe.problems
    try:
        dev, dt = _resolve_device(config)
    except InputError as err:
        raise InputError(group_problems([*problems, ("", str(err))])) from None
    settings = config.model_copy(update={"pv": resolve_pv(config.pv, dev)})
    cache_problems = _compile_cache_problems(recipe, dev)
    if cache_problems:  # what follows imports torch._dynamo, which creates Inductor's folder: a traceback there
        raise InputError(group_problems([*problems, *cache_problems]))
    defaults = {k: v for k, v in settings.job_defaults().items() if k not in bad}  # bad ones are said already
    file_items = loaded.items if loaded is not None else []
    labelled = [*file_items, *_labelled_items(prompts_or_jobs, settings.prompts_file, have_jobs=loaded is not None)]
    notes = _shadowed_options(job_file, file_items, config)
    parsed, found = collect_jobs(labelled, defaults)
    problems += found
    source = None
    if "model" not in bad:  # the jobs' model-specific checks need the model; the rest is listed
        try:
            source = resolve_model(settings.model)
        except InputError as err:
            problems.append(("", str(err)))
    resolved: list[tuple[JobSpec, Any]] = []
    plan_shas: dict[str, str] = {}
    image_shas: dict[str, str] = {}
    if source is not None:
        with_items = [(_resolve_job(source, j), label, item) for j, label, item in parsed]
        resolved = [(j, label) for j, label, _ in with_items]
        # The options on their own first: a bad --frames is said even when no job parses.
        stand_in = JobSpec(prompt="-", **{k: v for k, v in defaults.items() if v is not None})
        checked = [(_resolve_job(source, stand_in), f"--model {settings.model} defaults", {}), *with_items]
        for j, label, item in checked:
            for problem in source.problems(j):
                problems.append(_problem_at(label, item, problem.split(":", 1)[0], problem, defaults))
        plan_shas, plan_problems, plan_notes = check_plans(source, with_items, defaults)
        image_shas, image_problems, image_notes = check_images(source, with_items, defaults)
        problems += plan_problems + image_problems + _duplicate_outputs(resolved)
        if recipe.checkable:  # what this machine and model cannot run of the recipe
            found = recipe_problems(settings.recipe, source, dev, dt, settings.gpus_per_job)
            problems += [recipe.place(option.split()[0].removeprefix("--").replace("-", "_"), option, text)
                         for option, text in found]
            problems += _bf16_step_problems(recipe, with_items)
        notes += plan_notes + image_notes
    if problems:
        raise InputError(group_problems(problems))
    if not resolved:
        raise InputError("no prompts to generate; give at least one")
    for j, label, _ in with_items:  # e.g. prompt tokens the text encoder drops: once per job, before anything loads
        notes += [f"{where(label, note.split(':', 1)[0])}: {note}" for note in source.notes(j)]
    if settings.fps is None:  # the frame rate the model's videos are made for
        settings = settings.model_copy(update={"fps": source.default_fps})
    gpus_per_job = settings.gpus_per_job
    problems = degree_problems(source, resolved, gpus_per_job)  # raises for batch-wide problems
    if problems:
        raise InputError(group_problems(problems))

    backends: dict[tuple[str, str | None], str | None] = {}
    for j, _ in resolved:
        key = (j.attention, j.pv)
        if key not in backends:
            backends[key], found = _resolve_backend(settings, j.attention, j.pv, source, dev, dt)
            notes += [n for n in found if n not in notes]
    default_backend = backends.get((settings.attention, settings.pv if settings.attention == "sage" else None))
    if default_backend is None and settings.attention == "sage":
        default_backend, _ = _resolve_backend(settings, "sage", settings.pv, source, dev, dt)
    address, workers, job_timeout = settings.address, settings.workers, settings.job_timeout
    use_ray, execution_notes = _resolve_execution(address, workers, dev, gpus_per_job)
    notes += execution_notes
    # On CUDA only for a run in this process: a driver that Ray workers serve must not take a GPU context.
    here = address is None and not (use_ray and dev == "cuda")
    problems, estimate_notes = _budget(source, resolved, backends, dev, dt, job_timeout, local=here,
                                       recipe=settings.recipe)
    if problems:
        raise InputError(group_problems(problems))
    notes += estimate_notes
    planned, labels, seen, duplicates = [], [], set(), 0
    for j, label in resolved:
        key = (j.attention, j.pv)
        id_settings = {
            "model_fingerprint": source.fingerprint,
            "backend": backends[key],
            "dtype": dt,
            "fps": settings.fps,
            "plan_sha256": plan_shas.get(j.plan),
        }
        if source.is_tiny:  # a built-in model's name, never a folder's path: a copied folder is the same model
            id_settings["model"] = source.name
        if j.image is not None:  # only then: the ids of jobs without an image stay what they were
            id_settings["image_sha256"] = image_shas[j.image]
        if not settings.recipe.is_plain:  # fp8 linears and caches change the video; plain recipes keep their ids
            id_settings["recipe"] = settings.recipe.settings()
        # The plan's and the image's content, not their paths, decide the output: moving a file keeps the id.
        identity = JobIdentity(j.model_copy(update={"plan": None, "image": None}), id_settings)
        jid = identity.job_id
        if jid in seen:
            duplicates += 1
            continue
        seen.add(jid)
        planned.append(
            PlannedJob(
                job=j,
                job_id=jid,
                output=f"{output_stem(j, jid)}.mp4",
                label=str(label),
                backend=backends[key],
                plan_sha256=plan_shas.get(j.plan),
                image_sha256=image_shas.get(j.image) if j.image is not None else None,
                identity=identity,
            )
        )
        labels.append(label)
    problems = _automatic_name_clashes(planned, labels)
    if problems:
        raise InputError(group_problems(problems))
    out_dir = _prepare_out_dir(settings.out, ab_arm)  # last: the only check that writes (it may create the folder)
    if duplicates:
        notes.append(f"{duplicates} duplicate job(s) (same prompt and settings) will run once")
    same_video = len(planned) - len({pj.render_key for pj in planned})
    if same_video:
        notes.append(f"{same_video} job(s) make the same video as another under another name (same prompt, seed and "
                     "settings): it is rendered once and they get a hard link (or copy) of it")
    return BatchPlan(
        out=out_dir,
        settings=settings,
        source=source,
        device=dev,
        dtype=dt,
        backend=default_backend,
        jobs=planned,
        notes=notes,
        use_ray=use_ray,
        address=address,
        workers=workers,
        max_attempts=settings.max_attempts,
        gpus_per_job=gpus_per_job,
        job_timeout=None if job_timeout is None else float(job_timeout),
    )


@dataclass
class _BatchRecipe:
    """The batch's recipe: the options' under a job file's `recipe:` section (`layer_recipe`),
    with its problems placed where each setting came from. checkable: no setting is bad or in
    conflict, so the recipe is checked against the machine (a bad one would only add noise)."""

    recipe: Any
    file: Any = None  # the job file's FileRecipe, or None
    from_file: set[str] = field(default_factory=set)
    problems: list[tuple[str, str]] = field(default_factory=list)
    checkable: bool = True

    @classmethod
    def of(cls, config: GenerateConfig, file_recipe: Any, bad: set[str]) -> _BatchRecipe:
        from sagevideo.jobs.recipe import layer_recipe

        given = config.recipe
        made = cls(given, file_recipe)
        conflicts: list[str] = []
        if file_recipe is not None:
            made.recipe, conflicts = layer_recipe(given, file_recipe.fields)
            made.from_file = {name for name in file_recipe.fields if name not in conflicts}
            for name in conflicts:
                option = option_place(name, getattr(given, name))
                made.problems.append((file_recipe.at(name), (
                    f"{name}: the job file's recipe sets {file_recipe.fields[name]!r} and {option} is given too; "
                    "set it in one place (the file's recipe applies where the option is left out)")))
        unusable = (bad | set(conflicts) | set(file_recipe.bad if file_recipe is not None else ())) & set(RECIPE_FIELDS)
        contradictions = made.recipe.problems() if not unusable else []
        made.problems += [made.place(name, option, text) for name, option, text in contradictions]
        made.checkable = not unusable and not contradictions
        return made

    def place(self, name: str, option: str, text: str) -> tuple[str, str]:
        """(where, problem) of a setting: at its line in the job file when the file gave it, else the option."""
        if name in self.from_file:
            return self.file.at(name), f"{name}: {text}"
        return option, text


def _compile_cache_problems(recipe: _BatchRecipe, device: str) -> list[tuple[str, str]]:
    """(where, problem) for compile-cache folders that cannot be written: every folder under
    --compile (placed where compile was set), else a bad TORCHINDUCTOR_CACHE_DIR alone."""
    from sagevideo.pipelines.recipe import compile_cache_problems

    compile_ = recipe.recipe.compile
    compiling = recipe.checkable and compile_ != "none"
    found = compile_cache_problems(device, compiling=compiling)
    if not compiling:
        return [("", problem) for problem in found]
    return [recipe.place("compile", f"--compile {compile_}", problem) for problem in found]


def _labelled_items(
    prompts_or_jobs: PromptsOrJobs, prompts_file: str | Path | None, *, have_jobs: bool = False
) -> list[tuple[Any, str]]:
    """(item, label) pairs from a prompts file and the Python/CLI items; the built-in batch when
    nothing at all was given (have_jobs: a job file was given, even one whose jobs are all bad)."""
    items: list[tuple[Any, str]] = list(read_prompts_file(prompts_file)) if prompts_file is not None else []
    if isinstance(prompts_or_jobs, (str, Mapping, JobSpec)):
        prompts_or_jobs = [prompts_or_jobs]
    if prompts_or_jobs is not None:
        items += [(item, f"job {i}") for i, item in enumerate(prompts_or_jobs, start=1)]
    if have_jobs:
        return items
    if not items and prompts_file is None and prompts_or_jobs is None:
        items = [(p, f"default prompt {i}") for i, p in enumerate(DEFAULT_PROMPTS, start=1)]
    if not items:
        raise InputError("no prompts to generate; give at least one")
    return items


def _shadowed_options(
    job_file: str | Path | None, file_items: list[tuple[Any, Any]], config: GenerateConfig
) -> list[str]:
    """Notes for options given here (not at their default) that a job file overrides: job-file
    values win, which is right for per-shot settings but surprising if unsaid."""
    if not file_items:
        return []
    values = {**config.job_defaults(), "pv": config.pv}
    notes = []
    for name in JOB_DEFAULTS:
        value = values[name]
        if value == GenerateConfig.default(name) or (name in ("plan", "image") and value is None):
            continue
        keys = ("resolution", name) if name in ("height", "width") else (name,)
        count = sum(1 for item, _ in file_items if isinstance(item, Mapping) and any(k in item for k in keys))
        if count:
            notes.append(
                f"{Path(job_file).name} sets {name} for {count} of {len(file_items)} job(s); "
                f"there it wins over {name}={value!r} given here"
            )
    return notes


def _resolve_job(source: ModelSource, job: JobSpec) -> JobSpec:
    """Model defaults for size/steps; pv only means something for sagevideo attention."""
    job = source.resolve(job)
    return job.model_copy(update={"pv": job.pv if job.attention == "sage" else None})


def _bf16_step_problems(recipe: _BatchRecipe, jobs: list[tuple[JobSpec, Any, Any]]) -> list[tuple[str, str]]:
    """linear_bf16_steps that a resolved job's steps do not have, said once per step count."""
    steps = recipe.recipe.linear_bf16_steps
    option = f"--linear-bf16-steps {','.join(map(str, steps))}"
    found, seen = [], set()
    for job, label, _ in jobs:
        problem = recipe.recipe.step_problem(job.steps)
        if problem and job.steps not in seen:
            seen.add(job.steps)
            text = f"{problem} ({where(label, 'steps')} has {job.steps})"
            found.append(recipe.place("linear_bf16_steps", option, text))
    return found


def _problem_at(label: Any, item: Any, field: str, problem: str, options: Mapping[str, Any]) -> tuple[str, str]:
    """(where, problem) for a problem of a job's `field`: the option ('--frames 8') when the job
    took its value from an option given on the command line, else the job's own place."""
    value = options.get(field)
    if value is None or _item_sets(label, item, field):
        return where(label, field), problem
    text = problem.removeprefix(f"{field}: ")
    if field in ("plan", "image") and text.startswith(str(value)):  # '--plan p.json: does not exist': the path once
        text = text.removeprefix(str(value)).lstrip(": ")
    return option_place(field, value), text


def _item_sets(label: Any, item: Any, field: str) -> bool:
    """Whether a job item (or its job file's defaults) sets `field` itself."""
    if isinstance(label, Origin):
        return field in label.lines or field in label.inherited
    if isinstance(item, JobSpec):
        return True
    if isinstance(item, Mapping):
        return field in item or (field in ("height", "width") and "resolution" in item)
    return field == "prompt"


def check_plans(
    source: ModelSource, jobs: list[tuple[JobSpec, Any, Any]], options: Mapping[str, Any] | None = None
) -> tuple[dict[str, str], list[tuple[str, str]], list[str]]:
    """({plan path: first 16 hex digits of its SHA-256}, problems, notes) for every plan the jobs
    (job, label, item) name, checked as the run will use it: readable JSON, layers the model has
    (from its config, no weights), step ranges inside each job's steps. A note says when a plan
    made for N steps is used on jobs with another number of steps."""
    from sagevideo.pipelines.plans import AttentionPlan, PlanError

    options = options or {}
    fix = "give the path of an attention-plan JSON (relative paths are relative to the job file)"
    loaded: dict[str, AttentionPlan | str] = {}  # path -> plan, or why it cannot be used
    shas: dict[str, str] = {}
    problems: list[tuple[str, str]] = []
    reported: set[tuple[str, str]] = set()
    steps_of: dict[str, set[int]] = {}
    for j, label, item in jobs:
        if not j.plan:
            continue
        if j.plan not in loaded:
            path = Path(j.plan).expanduser()
            try:
                data = path.read_bytes()
                plan = AttentionPlan.from_json(data.decode("utf-8", errors="replace"), source=j.plan)
            except FileNotFoundError:
                loaded[j.plan] = f"{j.plan} does not exist; {fix}"
            except OSError as err:
                loaded[j.plan] = f"{j.plan} cannot be read ({err.strerror or err}); {fix}"
            except PlanError as err:
                loaded[j.plan] = f"{err}; write plans with `sagevideo calibrate`"
            else:
                loaded[j.plan] = plan
                shas[j.plan] = hashlib.sha256(data).hexdigest()[:16]
        plan = loaded[j.plan]
        found = [plan] if isinstance(plan, str) else [
            f"{j.plan}: {p}" for p in plan.problems_for(source.attention_layers, j.steps)
        ]
        for problem in found:
            place, text = _problem_at(label, item, "plan", f"plan: {problem}", options)
            if (place, text) not in reported:  # a plan that does not fit is said once per place
                reported.add((place, text))
                problems.append((place, text))
        if not found:
            steps_of.setdefault(j.plan, set()).add(j.steps)
    notes = []
    for path, steps in steps_of.items():
        plan = loaded[path]
        other = sorted(s for s in steps if plan.num_steps is not None and s != plan.num_steps)
        if other:
            shown = ", ".join(map(str, other))
            notes.append(
                f"plan {Path(path).name} was made for {plan.num_steps} steps but runs on jobs of {shown} step(s): "
                "its layer choices were measured at that step count and its step ranges count steps from 0 either way; "
                f"re-run `sagevideo calibrate --steps {other[0]}` to measure at the jobs' count"
            )
    return shas, problems, notes


def check_images(
    source: ModelSource, jobs: list[tuple[JobSpec, Any, Any]], options: Mapping[str, Any] | None = None
) -> tuple[dict[str, str], list[tuple[str, str]], list[str]]:
    """({image path: SHA-256 of the file}, problems, notes) for the input images of the jobs (job,
    label, item), before anything loads: first whether the model takes an image at all (a
    text-to-video model given one, an image-to-video model given none:
    `sagevideo.pipelines.families.image_use_problem`), then each image read once (it exists and
    PIL or imageio decodes it: `sagevideo.jobs.images.inspect_image`) and checked against every
    job that uses it (the family's `image_problems`: by default, an aspect ratio the resize would
    stretch is refused). A note says which images are resized to which job sizes."""
    from sagevideo.jobs.images import ImageError, ImageInfo, inspect_image
    from sagevideo.pipelines.families import image_use_problem

    options = options or {}
    family = source.model_family
    read: dict[str, ImageInfo | str] = {}  # path -> image, or why it cannot be used
    problems: list[tuple[str, str]] = []
    reported: set[tuple[str, str]] = set()
    resized: dict[tuple[str, str, str], int] = {}

    def add(label: Any, item: Any, problem: str) -> None:
        place, text = _problem_at(label, item, "image", problem, options)
        if (place, text) not in reported:  # an image that does not fit is said once per place
            reported.add((place, text))
            problems.append((place, text))

    for j, label, item in jobs:
        use = image_use_problem(source, j)
        if use is not None:
            add(label, item, use)
            continue
        if j.image is None:
            continue
        if j.image not in read:
            try:
                read[j.image] = inspect_image(j.image)
            except ImageError as err:
                read[j.image] = str(err)
        image = read[j.image]
        found = [f"image: {image}"] if isinstance(image, str) else family.image_problems(source, j, image)
        for problem in found:
            add(label, item, problem)
        if not found and (image.width, image.height) != (j.width, j.height):
            key = (Path(image.path).name, image.size, f"{j.width}x{j.height}")
            resized[key] = resized.get(key, 0) + 1
    notes = [f"image {name} ({size}) is resized to {target} for {count} job(s)"
             for (name, size, target), count in resized.items()]
    shas = {path: image.sha256 for path, image in read.items() if not isinstance(image, str)}
    return shas, problems, notes


def _budget(
    source: ModelSource,
    resolved: list[tuple[JobSpec, Any]],
    backends: Mapping[tuple[str, str | None], str | None],
    device: str,
    dtype: str,
    job_timeout: float | None,
    *,
    local: bool,
    recipe: Any = None,
) -> tuple[list[tuple[str, str]], list[str]]:
    """(problems, notes): jobs whose estimated peak memory exceeds what this machine's device has
    free are refused with the estimate (`local`: the jobs run here, not on a cluster's nodes);
    large CPU jobs get a note with their measured attention time."""
    from sagevideo.generation.budget import available_bytes, format_bytes
    from sagevideo.generation.estimate import TIME_ESTIMATE_FROM_TOKENS, attention_seconds, estimate_job, time_note

    free = available_bytes(device) if local else None
    problems, notes, timed = [], [], set()
    for j, label in resolved:
        backend = backends[(j.attention, j.pv)]
        estimate = estimate_job(source, j, backend, dtype, recipe)
        if free is not None and estimate.peak > free:
            problems.append((where(label), (
                f"needs {estimate.describe()}, but the {device} has {format_bytes(free)} free; "
                "use a smaller resolution or fewer frames"
            )))
            continue
        key = (j.height, j.width, j.frames, j.steps, j.guidance > 1, backend, j.pv)
        if device == "cpu" and estimate.tokens >= TIME_ESTIMATE_FROM_TOKENS and key not in timed:
            timed.add(key)
            seconds = attention_seconds(source, j, backend, device, dtype)
            estimate = dataclasses.replace(estimate, attention_s=seconds)
            notes.append(time_note(str(label), estimate, backend, device, job_timeout))
    return problems, notes


def _duplicate_outputs(resolved: list[tuple[JobSpec, Any]]) -> list[tuple[str, str]]:
    """Two jobs naming the same output would overwrite each other (compared case-insensitively,
    as macOS and Windows file systems do)."""
    first: dict[str, Any] = {}
    problems = []
    for j, label in resolved:
        if not j.output:
            continue
        key = j.output.casefold()
        if key in first:
            problems.append(
                (
                    where(label, "output"),
                    f"output: {j.output!r} is already the output of {where(first[key], 'output')}; "
                    "give each job its own output name",
                )
            )
        else:
            first[key] = label
    return problems


def _automatic_name_clashes(planned: list[PlannedJob], labels: list[Any]) -> list[tuple[str, str]]:
    """An `output:` equal to another job's automatic name (slug + id) would make the two jobs
    write one file: one video lost, and every re-run rendering one of them again."""
    automatic = {pj.output.casefold(): label for pj, label in zip(planned, labels, strict=True) if not pj.job.output}
    problems = []
    for pj, label in zip(planned, labels, strict=True):
        other = automatic.get(pj.output.casefold()) if pj.job.output else None
        if other is not None:
            problems.append(
                (
                    where(label, "output"),
                    f"output: {pj.job.output!r} is the automatic output name of {where(other)} "
                    f"({pj.output}); give this job another output name",
                )
            )
    return problems


def _resolve_execution(
    address: str | None, workers: int | None, device: str, gpus_per_job: int = 1
) -> tuple[bool, list[str]]:
    """(run on Ray?, notes). Ray when an address is given, more than one worker is asked for,
    jobs span several GPUs (gpus_per_job > 1: one process per rank), or (workers unset) more than
    one GPU is visible; Ray is then checked to be installed. (Values are checked by GenerateConfig.)"""
    from sagevideo.scheduling import address_problem, ray_installed

    if address is not None:
        problem = address_problem(address)
        if problem:
            raise InputError(problem)
    gpus = 0
    if device == "cuda":
        import torch

        gpus = torch.cuda.device_count()
        if gpus_per_job > gpus and address is None:
            raise InputError(
                f"--gpus-per-job {gpus_per_job}: this machine shows {gpus} GPU(s); give at most {gpus}, "
                "or --address of a Ray cluster with a node that has enough"
            )
    asked = address is not None or (workers or 1) > 1 or gpus_per_job > 1
    if not asked and not (workers is None and gpus > 1):
        return False, []
    if not ray_installed():
        if gpus_per_job > 1:
            raise InputError(
                f"--gpus-per-job {gpus_per_job} starts one process per rank through Ray, which is not "
                "installed; pip install 'sagevideo[ray]', or run `torchrun --nproc-per-node N -m "
                "sagevideo.generation.torchrun ...` (the same options as generate)"
            )
        if asked:
            why = f"--address {address}" if address is not None else f"--workers {workers}"
            raise InputError(
                f"{why} needs Ray, which is not installed; pip install 'sagevideo[ray]', or leave it out "
                "to run in this process"
            )
        return False, [
            f"{gpus} GPUs are visible but Ray is not installed: running on one GPU in this process "
            "(pip install 'sagevideo[ray]' to use them all)"
        ]
    where_to = {None: "a local Ray instance", "auto": "the running Ray cluster (or a local instance)"}
    notes = [f"scheduling: Ray, on {where_to.get(address, f'the Ray cluster at {address}')}"]
    if gpus_per_job > 1:
        unit = "GPU" if device == "cuda" else "CPU process"
        notes.append(
            f"sequence parallelism: each job on {gpus_per_job} ranks (one {unit} each, one node per group); "
            "rank 0 decodes and writes"
        )
    return True, notes


def _prepare_out_dir(out: str | Path, ab_arm: bool = False) -> Path:
    """Create the output folder if needed and prove it is writable (a probe file); refuse a folder
    of a `sagevideo ab` run unless ab plans it (ab_arm): ab would set aside what this run wrote; and
    one whose manifest a newer sagevideo wrote to."""
    from sagevideo.outputs.folders import ab_folder_problem, writable_folder
    from sagevideo.outputs.manifest import Manifest

    problem = None if ab_arm else ab_folder_problem(out)
    if problem:
        raise InputError(problem)
    path = writable_folder(out, InputError, "; give a folder for the videos and manifest")
    manifest = path / MANIFEST_NAME
    if manifest.exists() and (not manifest.is_file()):
        raise InputError(f"--out {out}: {MANIFEST_NAME} there is not a file; remove it or use another folder")
    problem = Manifest(manifest).newer_schema_problem()
    if problem:
        raise InputError(f"--out {out}: {problem}")
    return path


def _resolve_device(settings: GenerateConfig) -> tuple[str, str]:
    """(device, dtype name): auto -> CUDA when torch sees a GPU; dtype bf16 on CUDA, fp32 on CPU."""
    device = resolve_device(settings.device)
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise InputError(f"--device cuda: torch {torch.__version__} sees no CUDA GPU; use --device cpu or auto")
    dtype = settings.dtype or ("bfloat16" if device == "cuda" else "float32")
    return device, dtype


def _resolve_backend(
    settings: GenerateConfig, attention: str, pv: str | None, source: ModelSource, device: str, dtype: str
) -> tuple[str | None, list[str]]:
    """(sageattn backend for the processors or None, notes) for jobs with this attention and pv.
    Explicit choices that cannot run raise."""
    import torch

    from sagevideo.attention import backends as attention_backends
    from sagevideo.attention.backends import AttentionCall, Backend

    if attention == "full":
        stock = source.model_family.title
        return None, [f"attention: full precision (the stock {stock} processor; nothing installed)"]
    backend = settings.backend
    if backend == "auto" and device == "cpu":
        # On CPU, sageattn's auto would fall back to full-precision SDPA and the run would not
        # exercise quantized numerics at all; the reference emulates them exactly.
        return "reference", [
            f"attention: --backend auto on CPU runs the quantization emulation (reference/{pv}); "
            "the Triton kernels need a CUDA GPU"
        ]
    if backend in ("auto", "triton"):
        # The attention room's registry decides, from the device, dtype and head dim alone: the
        # driver neither launches nor compiles a kernel (the workers choose each call's plan).
        call = AttentionCall(torch.device(device), getattr(torch, dtype), source.head_dim, pv=pv)
        try:
            problem = attention_backends.problem(Backend.TRITON, call)
        except ValueError as err:  # a misspelt SAGEVIDEO_SM90_KERNEL
            raise InputError(str(err)) from None
        if problem and backend == "triton":
            raise InputError(f"--backend triton cannot run: {problem}; use --backend auto or reference")
        if problem:
            return "auto", [f"attention: the Triton kernels cannot run ({problem}); auto falls back to SDPA"]
        return backend, [f"attention: Triton kernels (head dim {source.head_dim}, {pv.upper()} P·V on {device}; "
                         "`sagevideo env` shows each plan)"]
    return backend, [f"attention: sageattn backend {backend}/{pv}"]
