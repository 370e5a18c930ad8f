"""Run a planned batch: the jobs the manifest does not show as done, in this process (one model
load) or on Ray workers (`sagevideo.scheduling`, one load per worker).

Workers hand back staged files and records; this process alone renames each output into place and
appends its record to the manifest, one record per job per run. A failing job is recorded and the
batch goes on; Ctrl-C stops cleanly (`BatchInterrupted`), keeping what finished.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sagevideo.api.batch_plan import BatchPlan
from sagevideo.api.deadline import JobTimeoutError
from sagevideo.api.execute import KILL_HOOK_ENV, PlannedJob
from sagevideo.outputs.manifest import MANIFEST_NAME, Manifest, is_done

log = logging.getLogger("sagevideo")


@dataclass
class BatchReport:
    """What a run did. records: one per planned job (the new record, or the done one it skipped;
    {} for jobs an interrupt left unrun). retried: jobs that needed more than one attempt because
    a worker died. workers: where it ran, e.g. "2 Ray workers on 2 nodes" (None: this process)."""

    plan: BatchPlan
    records: list[dict[str, Any]]
    done: int = 0
    skipped: int = 0
    failed: int = 0
    retried: int = 0
    interrupted: bool = False
    workers: str | None = None
    attention: Counter = field(default_factory=Counter)  # backend label -> calls, e.g. "reference/fp16"
    fallbacks: Counter = field(default_factory=Counter)  # fallback reason -> calls

    @property
    def ok(self) -> bool:
        return self.failed == 0 and not self.interrupted

    def add(self, index: int, record: dict[str, Any], echo: Callable[[str], None]) -> None:
        """Count one finished job (its record is final and in the manifest)."""
        self.records[index] = record
        if record["status"] == "done":
            self.done += 1
        else:
            self.failed += 1
            echo(f"sagevideo: job {record['job_id']} ({self.plan.jobs[index].label}) failed: {record['error']}")
        if record.get("attempts", 1) > 1:
            self.retried += 1
        backends = record.get("backends") or {}
        self.attention.update(backends.get("counts", {}))
        self.fallbacks.update(backends.get("fallbacks", {}))

    def summary_line(self) -> str:
        """One line, e.g. 'sagevideo: 2 done, 0 skipped, 0 failed → out (manifest.jsonl);
        attention: reference/fp16 x8'."""
        full = sum(1 for pj in self.plan.jobs if pj.backend is None)
        if full == len(self.plan.jobs):
            # Sequence parallelism needs its own processors, which then run SDPA.
            sharded = self.plan.gpus_per_job > 1
            attention = "full precision (SDPA inside Ulysses)" if sharded else "full precision (nothing installed)"
        elif self.attention:
            attention = ", ".join(f"{label} x{n}" for label, n in self.attention.most_common())
        else:
            attention = f"{self.plan.backend}/{self.plan.settings.pv} (no new calls)"
        if full and full < len(self.plan.jobs):
            attention += f"; full precision for {full} job(s)"
        state = "interrupted after " if self.interrupted else ""
        line = (
            f"sagevideo: {state}{self.done} done, {self.skipped} skipped, {self.failed} failed → "
            f"{self.plan.out} ({MANIFEST_NAME}); attention: {attention}"
        )
        if self.workers:
            line += f"; ran on {self.workers}"
        if self.retried:
            line += f"; {self.retried} job(s) retried after a worker died"
        if self.fallbacks:
            reasons = "; ".join(f"{reason} (x{n})" for reason, n in self.fallbacks.most_common())
            line += f"; SDPA fallbacks: {reasons}"
        if self.interrupted:
            line += "; re-run the same command to resume"
        return line


class BatchInterrupted(KeyboardInterrupt):
    """Ctrl-C during `run_batch`: workers are stopped, finished jobs are in the manifest.

    report: what finished before the interrupt (`report.interrupted` is True).
    """

    def __init__(self, report: BatchReport):
        super().__init__("interrupted")
        self.report = report


def run_batch(
    plan: BatchPlan,
    *,
    progress: bool = True,
    echo: Callable[[str], None] | None = None,
    execute: Callable[..., Iterator[tuple[int, dict[str, Any]]]] | None = None,
) -> BatchReport:
    """Run the jobs of `plan` that are not done yet; see the module docstring.

    execute(plan, todo, status): runs `todo` [(plan index, PlannedJob)] and yields (index, record)
    as jobs finish (a generator: closing it stops the work); default: Ray workers when
    `plan.use_ray`, else this process. `scripts/sp_generate.py` passes its rank 0 under torchrun.

    Raises ModelLoadError when no model could be loaded, InputError when a Ray cluster cannot be
    joined, BatchInterrupted on Ctrl-C (after stopping the workers; finished jobs are recorded).
    """
    from tqdm.auto import tqdm
    from tqdm.contrib.logging import logging_redirect_tqdm


    echo = echo or log.warning
    manifest = Manifest(plan.manifest_path)
    for message in manifest.quarantine():  # torn or mistyped lines: said once, then set aside
        echo(f"sagevideo: {message}")
    report = BatchReport(plan=plan, records=[])
    todo: list[tuple[int, PlannedJob]] = []
    for index, (pj, previous) in enumerate(zip(plan.jobs, _previous_records(manifest, plan), strict=True)):
        if previous is not None:
            report.skipped += 1
            report.records.append(previous)
        else:
            todo.append((index, pj))
            report.records.append({})  # filled in as jobs finish, keeping plan order
    if not todo:
        return report
    for _, pj in todo:  # what a killed earlier run may have left (hidden files only)
        pj.remove_leftovers(plan.out)

    bar = tqdm(
        total=len(plan.jobs),
        initial=report.skipped,
        disable=not progress,
        unit="video",
        desc="sagevideo",
        dynamic_ncols=True,
    )
    status = lambda text: bar.set_postfix_str(text[:40], refresh=True)
    if execute is not None:
        results = execute(plan, todo, status)
    elif plan.use_ray:
        from sagevideo.scheduling import run_jobs

        results = run_jobs(plan, todo, status=status, echo=echo, report=report)
    else:
        results = _run_here(plan, todo, status)
    # Library warnings (e.g. diffusers' prompt truncation) print above the bar, not through it.
    libraries = [logging.getLogger(name) for name in ("diffusers", "transformers")]
    try:
        with logging_redirect_tqdm(loggers=libraries, tqdm_class=tqdm):
            for index, record in results:
                with _sigint_deferred():  # a video's rename and its manifest line go together
                    record = _commit(plan, plan.jobs[index], record)
                    manifest.append(record)
                    report.add(index, record, echo)
                bar.update(1)
    except KeyboardInterrupt:
        report.interrupted = True
        raise BatchInterrupted(report) from None
    finally:
        results.close()  # stops workers (Ray) or removes installed attention (here)
        bar.close()
        for _, pj in todo:
            pj.remove_leftovers(plan.out)
    return report


def pending_jobs(plan: BatchPlan) -> list[tuple[int, PlannedJob]]:
    """(plan index, job) of every job that `run_batch` would run now: those the manifest does not
    show as done. Every rank of a torchrun group calls it before its first job, so all agree."""
    previous = _previous_records(Manifest(plan.manifest_path), plan)
    return [(index, pj) for index, (pj, record) in enumerate(zip(plan.jobs, previous, strict=True)) if record is None]


def _run_here(plan: BatchPlan, todo: list[tuple[int, PlannedJob]], status: Callable[[str], None]) -> Iterator:
    """Jobs in this process, one model load: yields (plan index, record) as each finishes."""
    import os

    from sagevideo.api.execute import KillHook, PipelineHost

    status(f"loading {Path(plan.source.name).name}")
    host = PipelineHost(plan.context(), kill_hook=KillHook.parse(os.environ.get(KILL_HOOK_ENV)))
    try:
        for index, pj in todo:
            status(pj.output)
            yield index, host.run(pj, on_step=_step_watch(pj, status, plan.job_timeout), time_limit=plan.job_timeout)
    finally:
        host.close()


def _step_watch(pj: PlannedJob, status: Callable[[str], None], limit_s: float | None) -> Callable[[int, int], None]:
    """on_step for a job run in this process: shows the step, and stops a job past --job-timeout."""
    start = time.monotonic()

    def on_step(step: int, steps: int) -> None:
        status(pj.step_text(step, steps))
        elapsed = time.monotonic() - start
        if limit_s is not None and elapsed > limit_s:
            raise JobTimeoutError(f"ran past --job-timeout {limit_s:g} s ({elapsed:.0f} s, at step {step}/{steps})")

    return on_step


@contextlib.contextmanager
def _sigint_deferred() -> Iterator[None]:
    """Hold Ctrl-C for the few milliseconds of a commit, then raise it: an interrupt then never
    leaves a video under its final name without its manifest record, or a record uncounted."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers live in the main thread only
        return
    caught: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: caught.append(signum))
    try:
        yield
    finally:
        # None: the old handler was not set from Python; Python's own is the sane one to restore.
        signal.signal(signal.SIGINT, previous if previous is not None else signal.default_int_handler)
        if caught:
            raise KeyboardInterrupt


def _commit(plan: BatchPlan, pj: PlannedJob, record: dict[str, Any]) -> dict[str, Any]:
    """Give a done job's staged video (and PNG folder) its final name; the record becomes the
    manifest line. The folder goes first: the mp4's name is the one a re-run trusts."""
    from sagevideo.outputs.staging import commit, commit_folder

    staged = plan.out / str(record.get("_staged"))
    staged_frames = record.get("_staged_frames")
    record = {k: v for k, v in record.items() if not k.startswith("_")}  # private worker -> driver keys
    if record["status"] != "done":
        return record
    try:
        if pj.frames_dir:
            commit_folder(plan.out / str(staged_frames), plan.out / pj.frames_dir)
        commit(staged, plan.out / pj.output)
    except OSError as err:
        record.update(
            status="failed",
            error=(
                f"the finished video {staged.name} could not be moved into place ({err.strerror or err}); "
                "with several machines, --out must be a folder every node shares"
            ),
        )
    else:
        record["outputs"] = pj.outputs
    return record


def _previous_records(manifest: Manifest, plan: BatchPlan) -> list[dict[str, Any] | None]:
    """Per planned job: its latest record if that says done, its file is present and no later
    done job wrote the same file (a changed job with the same output name replaced it)."""
    records = manifest.records()
    latest = {r["job_id"]: r for r in records}
    writer: dict[str, str] = {}
    for r in records:
        if r.get("status") == "done":
            for name in r.get("outputs") or []:
                writer[name] = r["job_id"]
    found = []
    for pj in plan.jobs:
        previous = latest.get(pj.job_id)
        ok = is_done(previous, plan.out) and all(writer.get(name) == pj.job_id for name in previous["outputs"])
        found.append(previous if ok else None)
    return found
