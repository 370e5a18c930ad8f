"""`sagevideo.generate`: batch video generation into an output folder, resumable.

Two steps, so that every input problem is reported before a model is loaded:
- `plan_batch(...)` validates prompts or a job file (YAML/TOML/text), settings, model folder,
  attention-plan files and output folder, resolves model defaults, the device, each job's
  attention backend and where the batch runs (this process, or Ray), and gives each job a
  stable id and output name (raises `InputError`);
- `run_batch(plan)` runs the jobs that the manifest does not already show as done: in this
  process (one model load) or on Ray workers (`sagevideo.scheduling`, one load per worker).
  Workers hand back staged files and records; this process alone renames each video into place
  and appends its record to the manifest, one record per job per run. A failing job is recorded
  and the batch goes on; Ctrl-C stops cleanly (`BatchInterrupted`), keeping what finished.
`generate(...)` does both and returns the manifest records, one per job.
"""

from __future__ import annotations

import logging
from typing import Any

from sagevideo.errors import BatchInterrupted, BatchStopped, ModelLoadError
from sagevideo.generation.plan import BatchPlan, PromptsOrJobs, plan_batch
from sagevideo.generation.report import BatchReport
from sagevideo.generation.run import pending_jobs, run_batch
from sagevideo.host.pipeline_host import PlannedJob
from sagevideo.jobs.config import GenerateConfig
from sagevideo.outputs.manifest import ManifestRecord

log = logging.getLogger("sagevideo")

__all__ = [
    "BatchInterrupted",
    "BatchPlan",
    "BatchReport",
    "BatchStopped",
    "GenerateConfig",
    "ManifestRecord",
    "ModelLoadError",
    "PlannedJob",
    "generate",
    "pending_jobs",
    "plan_batch",
    "run_batch",
]


def generate(config: GenerateConfig | PromptsOrJobs = None, /, **options: Any) -> list[ManifestRecord]:
    """Generate one video per prompt/job into `out`; returns the manifest records, one per job.

    config: a `GenerateConfig`, or the prompts/jobs of one (a job file as a Path or a one-word
    string ending in .yaml/.yml/.toml/.txt, a prompt, a dict of `JobSpec` fields, a `JobSpec`, or
    a list of those; None (and no prompts_file/job_file): a built-in batch of two prompts).
    options: `GenerateConfig`'s fields (see it for each), over the config's when one is given.
    address/workers > 1 run the batch on Ray (`pip install 'sagevideo[ray]'`); so does
    gpus_per_job > 1, each job then split over that many ranks.
    Jobs that the manifest in `out` already records as done (with their file present) are skipped.
    Each record is a `ManifestRecord` (attributes, or `record["status"]` as in its JSON line).
    Raises InputError before loading anything when an input is invalid (or when another run
    writes into `out`); Ctrl-C or SIGTERM raises `BatchInterrupted` (a KeyboardInterrupt) after
    stopping the workers; a full disk raises `BatchStopped` after recording the job it hit.
    """
    config = GenerateConfig.build(config, **options)
    plan = plan_batch(config)
    for note in plan.notes:
        log.info(note)
    report = run_batch(plan, progress=config.progress)
    if report.stopped:
        raise BatchStopped(report)
    return report.records
