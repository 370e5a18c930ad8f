"""Load a batch: what `plan_batch` makes of a `GenerateConfig` before any model is looked at.

`load_batch(config, pv=...)` reads the job file (or the prompts), layers the job file's `recipe:`
section under the options, parses every job over the options and the file's defaults, and
returns a `LoadedBatch` whose `problems` are placed (where, problem) pairs: a bad option, a bad
line of the job file, a recipe setting given twice, a job field that does not parse, two jobs
naming one output. Nothing here imports torch or knows a model; checking the jobs against a
model is `sagevideo.pipelines.batch_check`'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sagevideo.errors import InputError
from sagevideo.jobs.config import JOB_DEFAULTS, GenerateConfig
from sagevideo.jobs.files import FileRecipe, Origin
from sagevideo.jobs.problems import option_place, where
from sagevideo.jobs.recipe import RECIPE_FIELDS, Recipe
from sagevideo.jobs.specs import DEFAULT_PROMPTS, JobSpec, collect_jobs
from sagevideo.jobs.text_files import read_prompts_file

Problem = tuple[str, str]  # (where, what is wrong): `sagevideo.jobs.problems.group_problems` lists them
LabelledJob = tuple[JobSpec, Any, Any]  # (job, its label: a str or a job-file Origin, the item it was parsed from)

__all__ = ["BatchRecipe", "LabelledJob", "LoadedBatch", "Problem", "load_batch", "place_problem"]


@dataclass
class BatchRecipe:
    """The batch's recipe: the options' under a job file's `recipe:` section (`layer_recipe`),
    with its problems placed where each setting came from. checkable: no setting is bad or in
    conflict, so the recipe is checked against the machine (a bad one would only add noise)."""

    recipe: Recipe
    file: FileRecipe | None = None
    from_file: set[str] = field(default_factory=set)
    problems: list[Problem] = field(default_factory=list)
    checkable: bool = True

    @classmethod
    def of(cls, config: GenerateConfig, file_recipe: FileRecipe | None, bad: set[str]) -> BatchRecipe:
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

    def place(self, name: str, option: str, text: str) -> Problem:
        """(where, problem) of a setting: at its line in the job file when the file gave it, else the option."""
        if name in self.from_file:
            return self.file.at(name), f"{name}: {text}"
        return option, text


@dataclass
class LoadedBatch:
    """A batch as read, before any model is known.

    config: the options with the job file's recipe layered in. job_file: the job file read, or None.
    recipe: where each recipe setting came from. jobs: every job that parses, (job, label, item),
    its fields over `defaults`. defaults: the options that are job fields (pv resolved), without the
    bad ones (said already). bad: names of the options whose values are bad. problems: every
    problem found so far, placed. notes: options a job file overrides."""

    config: GenerateConfig
    job_file: Path | None
    recipe: BatchRecipe
    jobs: list[LabelledJob]
    defaults: dict[str, Any]
    bad: set[str]
    problems: list[Problem]
    notes: list[str]


def load_batch(config: GenerateConfig, *, pv: str | None, use_file_recipe: bool = True) -> LoadedBatch:
    """Read and parse the batch `config` describes; see the module docstring.

    pv: the batch's P·V precision with "auto" resolved for the device (None when the device is
    unusable: the jobs are still parsed, for their problems). use_file_recipe: False reads a job
    file's `recipe:` section for its problems only (`sagevideo ab`'s full-precision arms run plain).
    Raises InputError only when a job file cannot be read at all, or nothing at all is given to generate.
    """
    from sagevideo.jobs.files import load_job_file, looks_like_job_file

    prompts_or_jobs, job_file = config.prompts_or_jobs, config.job_file
    if job_file is None and looks_like_job_file(prompts_or_jobs):
        job_file, prompts_or_jobs = Path(prompts_or_jobs), None
    loaded = load_job_file(job_file) if job_file is not None else None
    # Every problem is collected before anything is refused: a bad option, a bad default of the
    # job file and each job's own problems are listed together, each once.
    problems: list[Problem] = [(place, text) for _, place, text in config.bad_values]
    bad = {name for name, _, _ in config.bad_values}
    problems += loaded.problems if loaded is not None else []
    recipe = BatchRecipe.of(config, loaded.recipe if loaded is not None and use_file_recipe else None, bad)
    config = config.model_copy(update=recipe.recipe.model_dump())
    problems += recipe.problems
    defaults = {k: v for k, v in {**config.job_defaults(), "pv": pv}.items() if k not in bad}  # bad: said already
    file_items = loaded.items if loaded is not None else []
    labelled = [*file_items, *_labelled_items(prompts_or_jobs, config.prompts_file, have_jobs=loaded is not None)]
    jobs, found = collect_jobs(labelled, defaults)
    problems += found + _duplicate_outputs(jobs)
    notes = _shadowed_options(job_file, file_items, config)
    return LoadedBatch(config, job_file, recipe, jobs, defaults, bad, problems, notes)


def place_problem(label: Any, item: Any, field: str, problem: str, options: Mapping[str, Any]) -> Problem:
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


def _labelled_items(
    prompts_or_jobs: Any, prompts_file: str | Path | None, *, have_jobs: bool = False
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


def _duplicate_outputs(jobs: list[LabelledJob]) -> list[Problem]:
    """Two jobs naming the same output would overwrite each other (compared case-insensitively,
    as macOS and Windows file systems do)."""
    first: dict[str, Any] = {}
    problems = []
    for j, label, _ in jobs:
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
