"""Name a checked batch's jobs: each its id, its output name, and what clashes.

`name_jobs(jobs, settings_of)` gives every resolved (job, label) its `JobIdentity` (from the job
and `settings_of(job)`, the settings that change its output: `identity_settings`), its output
name (the job's `output:`, else a slug of its name or prompt and its id), runs jobs that are the
same job once, and places the problem of an `output:` equal to another job's automatic name.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from sagevideo.jobs.identity import JobIdentity
from sagevideo.jobs.problems import where
from sagevideo.jobs.specs import JobSpec, output_stem

__all__ = ["NamedJob", "Naming", "identity_settings", "name_jobs"]


@dataclass(frozen=True)
class NamedJob:
    """A job with its identity and its output name (relative to the output folder, .mp4)."""

    job: JobSpec
    label: Any
    identity: JobIdentity
    output: str

    @property
    def job_id(self) -> str:
        return self.identity.job_id


@dataclass
class Naming:
    """The named jobs (each job once, in batch order), the (where, problem) name clashes, and notes
    on jobs that run once for several (the same job twice, or the same video under two names)."""

    jobs: list[NamedJob]
    problems: list[tuple[str, str]]
    notes: list[str]


def identity_settings(
    *,
    fingerprint: str | None,
    backend: str | None,
    dtype: str,
    fps: int | None,
    plan_sha256: str | None,
    tiny_model: str | None = None,
    image_sha256: str | None = None,
    recipe: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The settings besides its fields that change a job's output (see `sagevideo.jobs.identity`).

    tiny_model: a built-in model's name (never a folder's path: a copied folder is the same model).
    image_sha256 and recipe count only when given, so the ids of jobs without an image and of
    plain recipes stay what they were."""
    settings: dict[str, Any] = {
        "model_fingerprint": fingerprint,
        "backend": backend,
        "dtype": dtype,
        "fps": fps,
        "plan_sha256": plan_sha256,
    }
    if tiny_model is not None:
        settings["model"] = tiny_model
    if image_sha256 is not None:
        settings["image_sha256"] = image_sha256
    if recipe is not None:
        settings["recipe"] = dict(recipe)
    return settings


def name_jobs(jobs: list[tuple[JobSpec, Any]], settings_of: Callable[[JobSpec], dict[str, Any]]) -> Naming:
    """Ids, output names and clashes of resolved (job, label) pairs; see the module docstring."""
    named: list[NamedJob] = []
    seen: set[str] = set()
    duplicates = 0
    for j, label in jobs:
        # The plan's and the image's content, not their paths, decide the output: moving a file keeps the id.
        identity = JobIdentity(j.model_copy(update={"plan": None, "image": None}), settings_of(j))
        if identity.job_id in seen:
            duplicates += 1
            continue
        seen.add(identity.job_id)
        named.append(NamedJob(j, label, identity, f"{output_stem(j, identity.job_id)}.mp4"))
    notes = []
    if duplicates:
        notes.append(f"{duplicates} duplicate job(s) (same prompt and settings) will run once")
    same_video = len(named) - len({n.identity.render_key for n in named})
    if same_video:
        notes.append(f"{same_video} job(s) make the same video as another under another name (same prompt, seed and "
                     "settings): it is rendered once and they get a hard link (or copy) of it")
    return Naming(named, _automatic_name_clashes(named), notes)


def _automatic_name_clashes(named: list[NamedJob]) -> list[tuple[str, str]]:
    """An `output:` equal to another job's automatic name (slug + id) would make the two jobs
    write one file: one video lost, and every re-run rendering one of them again."""
    automatic = {n.output.casefold(): n.label for n in named if not n.job.output}
    problems = []
    for n in named:
        other = automatic.get(n.output.casefold()) if n.job.output else None
        if other is not None:
            problems.append(
                (
                    where(n.label, "output"),
                    f"output: {n.job.output!r} is the automatic output name of {where(other)} "
                    f"({n.output}); give this job another output name",
                )
            )
    return problems
