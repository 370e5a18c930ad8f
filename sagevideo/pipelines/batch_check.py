"""Check a loaded batch against its model, from configs alone (no weights, nothing compiled).

`check_batch(batch, settings, device, dtype)` answers "can this model make these jobs here?": the
compile-cache folders a recipe writes to, the model folder, each job resolved with the model's
defaults and checked against its family's rules, the attention plans and input images the jobs
name (`check_plans`, `check_images`), the recipe against this machine and model, and the
sequence-parallel degree. Problems come back placed, (where, problem), where the user set the
value: at a job's line, or at the option the job took it from (`sagevideo.jobs.batch.place_problem`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sagevideo.errors import InputError
from sagevideo.jobs.batch import BatchRecipe, LabelledJob, LoadedBatch, Problem, place_problem
from sagevideo.jobs.config import GenerateConfig
from sagevideo.jobs.problems import where
from sagevideo.jobs.specs import JobSpec
from sagevideo.pipelines.loading import ModelSource

__all__ = ["CheckedBatch", "check_batch", "check_images", "check_plans"]


@dataclass
class CheckedBatch:
    """What the model made of a batch. source: the model (None when its folder is unusable).
    jobs: (job, label) with the model's defaults filled in. plan_shas/image_shas: content hashes of
    the attention plans and input images by path. problems, notes: placed problems; facts to say."""

    source: ModelSource | None = None
    jobs: list[tuple[JobSpec, Any]] = field(default_factory=list)
    plan_shas: dict[str, str] = field(default_factory=dict)
    image_shas: dict[str, str] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def check_batch(
    batch: LoadedBatch, settings: GenerateConfig, device: str, dtype: str, found: list[Problem] | None = None
) -> CheckedBatch:
    """Check `batch` (its options: `settings`, pv resolved) against its model on `device`/`dtype`.

    found: the problems known already (the batch's, the machine's); `problems` comes back with them
    first. The per-job checks run only when the compile caches are writable; the degree and the
    jobs' notes only when nothing at all is wrong. Raises InputError for what concerns the whole
    batch (no jobs at all, a degree the model cannot split)."""
    from sagevideo.pipelines.families import degree_problems
    from sagevideo.pipelines.loading import resolve_model

    cache_problems = _compile_cache_problems(batch.recipe, device)
    checked = CheckedBatch(problems=[*(found or []), *cache_problems])
    if cache_problems:  # what follows imports torch._dynamo, which creates Inductor's folder: a traceback there
        return checked
    if "model" not in batch.bad:  # the jobs' model-specific checks need the model; the rest is listed
        try:
            checked.source = resolve_model(settings.model)
        except InputError as err:
            checked.problems.append(("", str(err)))
    source = checked.source
    if source is None:
        return checked
    jobs = [(_resolve_job(source, j), label, item) for j, label, item in batch.jobs]
    checked.jobs = [(j, label) for j, label, _ in jobs]
    checked.problems += _family_problems(source, jobs, batch.defaults, settings.model)
    checked.problems += _sparse_problems(jobs, batch)
    checked.plan_shas, plan_problems, plan_notes = check_plans(source, jobs, batch.defaults)
    checked.image_shas, image_problems, image_notes = check_images(source, jobs, batch.defaults)
    checked.problems += plan_problems + image_problems + _recipe_problems(batch.recipe, source, jobs, device, dtype,
                                                                         settings.gpus_per_job)
    checked.notes += plan_notes + image_notes
    if checked.problems:
        return checked
    if not jobs:
        raise InputError("no prompts to generate; give at least one")
    for j, label, _ in jobs:  # e.g. prompt tokens the text encoder drops: once per job, before anything loads
        checked.notes += [f"{where(label, note.split(':', 1)[0])}: {note}" for note in source.notes(j)]
    checked.problems = degree_problems(source, checked.jobs, settings.gpus_per_job)  # raises for batch-wide problems
    return checked


def _family_problems(
    source: ModelSource, jobs: list[LabelledJob], defaults: Mapping[str, Any], model: str
) -> list[Problem]:
    """The family's rules for each resolved job, the options on their own first: a bad --frames is
    said even when no job parses."""
    stand_in = JobSpec(prompt="-", **{k: v for k, v in defaults.items() if v is not None})
    problems = []
    for j, label, item in [(_resolve_job(source, stand_in), f"--model {model} defaults", {}), *jobs]:
        for problem in source.problems(j):
            problems.append(place_problem(label, item, problem.split(":", 1)[0], problem, defaults))
    return problems


def _sparse_problems(jobs: list[LabelledJob], batch: LoadedBatch) -> list[Problem]:
    """`--sparse` where a resolved job cannot run it (with attention full, with a plan file: at the
    job or the option it came from; `jobs.sparse`)."""
    from sagevideo.jobs.sparse import job_sparse_problem

    return [place_problem(label, item, "sparse", problem, batch.defaults)
            for j, label, item in jobs if (problem := job_sparse_problem(j.sparse, j.attention, j.plan))]


def _recipe_problems(
    recipe: BatchRecipe, source: ModelSource, jobs: list[LabelledJob], device: str, dtype: str, gpus_per_job: int
) -> list[Problem]:
    """What this machine and model cannot run of the recipe (nothing when a setting is bad already)."""
    from sagevideo.pipelines.recipe import recipe_problems

    if not recipe.checkable:
        return []
    found = recipe_problems(recipe.recipe, source, device, dtype, gpus_per_job)
    problems = [recipe.place(option.split()[0].removeprefix("--").replace("-", "_"), option, text)
                for option, text in found]
    return problems + _bf16_step_problems(recipe, jobs)


def _compile_cache_problems(recipe: BatchRecipe, device: str) -> list[Problem]:
    """(where, problem) for compile-cache folders that cannot be written: every folder under
    --compile (placed where compile was set), else a bad TORCHINDUCTOR_CACHE_DIR alone."""
    from sagevideo.pipelines.recipe import compile_cache_problems

    compile_ = recipe.recipe.compile
    compiling = recipe.checkable and compile_ != "none"
    found = compile_cache_problems(device, compiling=compiling)
    if not compiling:
        return [("", problem) for problem in found]
    return [recipe.place("compile", f"--compile {compile_}", problem) for problem in found]


def _resolve_job(source: ModelSource, job: JobSpec) -> JobSpec:
    """Model defaults for size/steps; pv only means something for sagevideo attention."""
    job = source.resolve(job)
    return job.model_copy(update={"pv": job.pv if job.attention == "sage" else None})


def _bf16_step_problems(recipe: BatchRecipe, jobs: list[LabelledJob]) -> list[Problem]:
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
            place, text = place_problem(label, item, "plan", f"plan: {problem}", options)
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
        place, text = place_problem(label, item, "image", problem, options)
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
