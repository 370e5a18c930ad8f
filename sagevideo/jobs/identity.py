"""A planned job's identity: its manifest id, its render key, and the ids it had under other models.

Both hash the job's fields and `settings`, what else changes its output: the model's fingerprint
(its content: `sagevideo.pipelines.fingerprint`; plus the name of a built-in tiny model, never a
folder's path), backend, dtype, fps, the attention plan's and input image's content hashes, the
speed recipe. The job comes with plan and image left out (their content is among the settings); its
block-sparse setting counts only when on.
- job id (16 hex digits): also the job's name and output, so two named jobs are two records;
  not frames_png, an output form (PNG frames are added to a finished job, not re-rendered);
- render key (16 hex digits): only what decides the pixels (no name, output or frames_png):
  jobs that share it make the same video, so it is rendered once;
- `id_under(fingerprint)`: the job's id under another state of the model (a render that a changed
  model made stale); `legacy_id(model, fingerprint)`: its id as sagevideo made them before
  (the model's path among the settings, frames_png counted when on), to recognise those records.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from sagevideo.jobs.sparse import is_sparse
from sagevideo.jobs.specs import JobSpec

OUTPUT_FORMS = {"frames_png"}  # what a job writes besides its mp4; never part of what it is
NAMES = {"name", "output"}  # what a job is called


def job_id(job: JobSpec, settings: Mapping[str, Any]) -> str:
    """Stable 16-hex-digit id of a job under the settings that change its output (an image counts
    only when set, so ids of jobs written before the field existed still match)."""
    return _digest(job, settings, exclude=OUTPUT_FORMS)


def render_key(job: JobSpec, settings: Mapping[str, Any]) -> str:
    """16 hex digits of what decides a job's pixels: equal for the same video under other names."""
    return _digest(job, settings, exclude=OUTPUT_FORMS | NAMES)


@dataclass(frozen=True)
class JobIdentity:
    """job: the job as identified (plan and image None); settings: see the module docstring."""

    job: JobSpec
    settings: dict[str, Any] = field(default_factory=dict)

    @cached_property
    def job_id(self) -> str:
        return job_id(self.job, self.settings)

    @cached_property
    def render_key(self) -> str:
        return render_key(self.job, self.settings)

    def id_under(self, fingerprint: str | None) -> str:
        """The job id under another model fingerprint."""
        return job_id(self.job, {**self.settings, "model_fingerprint": fingerprint})

    def legacy_id(self, model: str | None, fingerprint: str | None) -> str:
        """The id sagevideo gave this job before ids followed content: model path and fingerprint
        among the settings, frames_png counted when on."""
        settings = {**self.settings, "model": model, "model_fingerprint": fingerprint}
        return _digest(self.job, settings, exclude=set() if self.job.frames_png else OUTPUT_FORMS)


def _digest(job: JobSpec, settings: Mapping[str, Any], exclude: set[str]) -> str:
    exclude = set(exclude) | ({"image"} if job.image is None else set())
    if not is_sparse(job.sparse):  # counted only when on: ids of dense jobs stay what they were
        exclude.add("sparse")
    fields = job.model_dump(exclude=exclude)
    payload = json.dumps({"job": fields, "settings": dict(settings)}, sort_keys=True, ensure_ascii=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]
