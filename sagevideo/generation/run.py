"""Run a planned batch: the jobs the manifest does not show as done, in this process (one model
load) or on Ray workers (`sagevideo.scheduling`, one load per worker). Jobs whose video is
finished already (the same render under another name, or a finished job that now asks for PNG
frames) are made from it without rendering (`generation.resume` decides, `generation.reuse` makes),
and jobs of a batch that make the same video render it once.

Workers hand back staged files and records; this process alone renames each output into place and
appends its record to the manifest, one record per job per run. A failing job is recorded and the
batch goes on; Ctrl-C, SIGTERM or SIGHUP stops cleanly (`BatchInterrupted`), keeping what finished
(`generation.signals`: a signal whose exception a library lost still stops the run at its next checkpoint).

What keeps this true when things go wrong:
- one run per output folder: `run_batch` locks it (`outputs.folders.FolderLock`); a second run is
  refused with an InputError that names the first (pid, host, command, since when);
- an output name that holds another job's video (a job changed but kept its `output:` name) is
  never overwritten: that video is renamed `<name>.was-<its job id>.mp4` first and its job's
  record appended again with the new name, and the summary says so;
- a video rename and its manifest line go together: if the line cannot be written (disk full),
  the rename is undone and the batch stops; a video the disk had no room for stops it too;
- earlier renders that a changed model made stale are rendered again, and the summary says how
  many and why (their files stay: automatic names change with the model, fixed ones are kept aside).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sagevideo.errors import BatchInterrupted, BatchStopped, InputError, Terminated
from sagevideo.generation.commit import Committer
from sagevideo.generation.plan import BatchPlan
from sagevideo.generation.report import BatchReport, stale_text
from sagevideo.generation.resume import Resume, decide
from sagevideo.generation.signals import StopSignals, signal_name, stop_signals
from sagevideo.host.deadline import JobTimeoutError
from sagevideo.host.pipeline_host import PlannedJob, RunContext, base_record
from sagevideo.outputs.manifest import Manifest, ManifestRecord, now_iso
from sagevideo.scheduling.spec import JobFinished, JobOutcome, PoolSummary

__all__ = [
    "BatchInterrupted", "BatchReport", "BatchStopped", "Terminated", "outcome_record", "pending_jobs", "run_batch",
]

log = logging.getLogger("sagevideo")


def run_batch(
    plan: BatchPlan,
    *,
    progress: bool = True,
    echo: Callable[[str], None] | None = None,
    execute: Callable[..., Iterator[tuple[int, ManifestRecord]]] | None = None,
    lock: Any = None,
) -> BatchReport:
    """Run the jobs of `plan` that are not done yet; see the module docstring.

    lock: a `FolderLock` on plan.out that the caller holds already (`sagevideo ab` takes every
    arm's before its first arm runs); run_batch then neither takes nor releases it.

    execute(plan, todo, status): runs `todo` [(plan index, PlannedJob)] and yields (index, record)
    as jobs finish (a generator: closing it stops the work); default: Ray workers when
    `plan.use_ray`, else this process. `sagevideo.generation.torchrun` passes its rank 0 under torchrun.

    Raises ModelLoadError when no model could be loaded, InputError when a Ray cluster cannot be
    joined or another run holds the output folder, BatchInterrupted on Ctrl-C, SIGTERM or SIGHUP
    (after stopping the workers; finished jobs are recorded). A full disk ends the run early with
    `report.stopped` set.
    """
    from sagevideo.outputs.folders import FolderLock, remove_dead_markers

    echo = echo or log.warning
    own = lock is None
    lock = FolderLock(plan.out, InputError) if own else lock
    with stop_signals() as signals:
        try:
            if own:
                lock.acquire(note=echo)
            try:
                remove_dead_markers(plan.out, locked=lock.held)  # left by a run killed outright (kill -9)
                return _run_locked(plan, progress=progress, echo=echo, execute=execute, signals=signals)
            finally:
                if own:
                    lock.release()
        except KeyboardInterrupt as stop:
            signals.stopping = True
            if isinstance(stop, BatchInterrupted):
                raise
            # Before any job was handed out (taking the lock): nothing to keep.
            report = BatchReport(plan=plan, records=[None for _ in plan.jobs], interrupted=True)
            report.signal = signal_name(stop, signals)
            raise BatchInterrupted(report) from None


def _run_locked(
    plan: BatchPlan,
    *,
    progress: bool,
    echo: Callable[[str], None],
    execute: Callable[..., Iterator[tuple[int, ManifestRecord]]] | None,
    signals: StopSignals | None = None,
) -> BatchReport:
    """`run_batch` once the output folder is this run's. signals: the run's stop signals (their
    checkpoints: every status update, which comes at each job's start and each step, and each finished job)."""
    signals = signals if signals is not None else StopSignals()
    from tqdm.auto import tqdm
    from tqdm.contrib.logging import logging_redirect_tqdm

    manifest, records = _open_manifest(plan, echo)
    report = BatchReport(plan=plan, records=[])
    work = _Work.sort(plan, decide(plan, records), report)
    if not work.open_jobs:
        return report
    if report.stale:
        echo(f"sagevideo: {stale_text(report.stale, plan.source.fingerprint)}")
    for pj in work.open_jobs:  # what a killed earlier run may have left (hidden files only)
        pj.remove_leftovers(plan.out)
    bar = tqdm(total=len(plan.jobs), initial=report.skipped, disable=not progress, unit="video", desc="sagevideo",
               dynamic_ncols=True)

    def status(text: str) -> None:
        signals.check()  # a stop signal whose exception was lost on its way stops the run here
        bar.set_postfix_str(text[:40], refresh=True)

    committer = Committer(plan, manifest, records, report, echo)
    results = None
    # Library warnings (e.g. diffusers' prompt truncation) print above the bar, not through it.
    libraries = [logging.getLogger(name) for name in ("diffusers", "transformers")]
    try:
        with logging_redirect_tqdm(loggers=libraries, tqdm_class=tqdm):
            _make_from_finished(work, committer, status, bar.update, signals)
            if work.todo and not report.stopped:
                results = (execute or _executor(plan, echo, report))(plan, work.todo, status)
                _commit_results(results, work, committer, bar.update, signals)
    except KeyboardInterrupt as stop:
        signals.stopping = True
        report.interrupted = True
        report.signal = signal_name(stop, signals)
        raise BatchInterrupted(report) from None
    finally:
        if results is not None:
            results.close()  # stops workers (Ray) or removes installed attention (here)
        with contextlib.suppress(OSError):  # a terminal that is gone (SIGHUP: EIO) must not hide the stop
            bar.close()
        for pj in work.open_jobs:
            pj.remove_leftovers(plan.out)
    return report


def _open_manifest(plan: BatchPlan, echo: Callable[[str], None]) -> tuple[Manifest, list[ManifestRecord]]:
    """The output folder's manifest and its records; torn or mistyped lines said once and set aside.
    Raises InputError when a newer sagevideo wrote there since the batch was planned."""
    manifest = Manifest(plan.manifest_path)
    newer = manifest.newer_schema_problem()  # planned before a newer sagevideo wrote there
    if newer:
        raise InputError(f"--out {plan.out}: {newer}")
    for message in manifest.quarantine():
        echo(f"sagevideo: {message}")
    return manifest, manifest.records()


@dataclass
class _Work:
    """What a run does with each planned job, by plan index. todo: jobs to render here;
    from_finished: (index, the finished render it is made from); followers: index of a job
    rendered here -> jobs made from its video; open_jobs: every job not skipped."""

    todo: list[tuple[int, PlannedJob]] = field(default_factory=list)
    from_finished: list[tuple[int, ManifestRecord]] = field(default_factory=list)
    followers: dict[int, list[int]] = field(default_factory=dict)
    open_jobs: list[PlannedJob] = field(default_factory=list)

    @classmethod
    def sort(cls, plan: BatchPlan, resume: Resume, report: BatchReport) -> _Work:
        """Sort the jobs by the manifest's decisions; skipped jobs are counted and their records
        put in the report (the others' records are None until they finish)."""
        report.stale = resume.stale
        work = cls()
        for index, (pj, decision) in enumerate(zip(plan.jobs, resume.decisions, strict=True)):
            report.records.append(decision.record if decision.kind == "skip" else None)
            if decision.kind == "skip":
                report.skipped += 1
                continue
            work.open_jobs.append(pj)
            if decision.kind == "reuse":
                work.from_finished.append((index, decision.record))
            elif decision.kind == "follow":
                work.followers.setdefault(decision.leader, []).append(index)
            else:
                work.todo.append((index, pj))
        return work


def _make_from_finished(
    work: _Work, committer: Committer, status: Callable[[str], None], advance: Callable[[int], Any],
    signals: StopSignals,
) -> None:
    """Jobs made from finished renders of the same video: no model needed, so before any load."""
    for index, source in work.from_finished:
        status(committer.plan.jobs[index].output)
        committer.made_from(index, source, signals)
        advance(1)
        if committer.report.stopped:
            return


def _commit_results(
    results: Iterator[tuple[int, ManifestRecord]], work: _Work, committer: Committer,
    advance: Callable[[int], Any], signals: StopSignals,
) -> None:
    """Commit each job as it finishes, then the jobs made from its video; stop when the report does."""
    report = committer.report
    for index, record in results:
        if not record.done:
            signals.check()  # a job that failed after a stop signal: the signal may be why; not recorded
        with signals.held():  # a video's rename and its manifest line go together
            committer.finish(index, record)
        advance(1)
        for follower in work.followers.get(index, []):
            if report.stopped:
                break
            committer.follow(follower, index, signals)
            advance(1)
        if report.stopped:
            return


def _executor(plan: BatchPlan, echo: Callable[[str], None], report: BatchReport) -> Callable[..., Iterator]:
    """execute(plan, todo, status) for the plan: Ray workers when `plan.use_ray`, else this process."""
    if not plan.use_ray:
        return _run_here

    def on_ray(plan: BatchPlan, todo: list[tuple[int, PlannedJob]], status: Callable[[str], None]) -> Iterator:
        from sagevideo.scheduling import run_jobs

        def ran_on(pool: PoolSummary) -> None:
            report.workers = pool.describe()

        outcomes = run_jobs(plan.scheduling(), todo, status=status, echo=echo, on_pool=ran_on)
        return _records(plan, dict(todo), outcomes)

    return on_ray


def _records(
    plan: BatchPlan, jobs: dict[int, PlannedJob], outcomes: Iterator[tuple[int, JobOutcome]]
) -> Iterator[tuple[int, ManifestRecord]]:
    """(plan index, record) of each outcome the scheduler yields; closing this closes the scheduler."""
    with contextlib.closing(outcomes):
        for index, outcome in outcomes:
            yield index, outcome_record(plan.context(), jobs[index], outcome)


def outcome_record(ctx: RunContext, pj: PlannedJob, outcome: JobOutcome) -> ManifestRecord:
    """The manifest record of a job the scheduler hands back: rank 0's record with the attempts a
    worker's death ended, or, for a job no worker finished, its record before it ran, failed with why."""
    if isinstance(outcome, JobFinished):
        return outcome.result.record.replace(retries=list(outcome.retries))
    record = base_record(ctx, pj)
    record.status, record.error = "failed", outcome.error
    record.attempts, record.retries = outcome.attempts, list(outcome.retries)
    record.worker = outcome.worker
    record.backends, record.created = {"counts": {}, "fallbacks": {}}, now_iso()
    return record


def pending_jobs(plan: BatchPlan) -> list[tuple[int, PlannedJob]]:
    """(plan index, job) of every job that `run_batch` would render now: those the manifest does not
    show as done and no finished or earlier job's video makes. Every rank of a torchrun group calls it
    before its first job, so all agree."""
    return decide(plan, Manifest(plan.manifest_path).records()).rendered(plan.jobs)


def _run_here(plan: BatchPlan, todo: list[tuple[int, PlannedJob]], status: Callable[[str], None]) -> Iterator:
    """Jobs in this process, one model load: yields (plan index, record) as each finishes."""
    from sagevideo.host.pipeline_host import PipelineHost

    status(f"loading {Path(plan.source.name).name}")
    host = PipelineHost(plan.context())
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
