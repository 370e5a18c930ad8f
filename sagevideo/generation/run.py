"""Run a planned batch: the jobs the manifest does not show as done, in this process (one model
load) or on Ray workers (`sagevideo.scheduling`, one load per worker).

Workers hand back staged files and records; this process alone renames each output into place and
appends its record to the manifest, one record per job per run. A failing job is recorded and the
batch goes on; Ctrl-C or SIGTERM stops cleanly (`BatchInterrupted`), keeping what finished.

What keeps this true when things go wrong:
- one run per output folder: `run_batch` locks it (`outputs.folders.FolderLock`); a second run is
  refused with an InputError that names the first (pid, host, command, since when);
- an output name that holds another job's video (a job changed but kept its `output:` name) is
  never overwritten: that video is renamed `<name>.was-<its job id>.mp4` first and its job's
  record appended again with the new name, and the summary says so;
- a video rename and its manifest line go together: if the line cannot be written (disk full),
  the rename is undone and the batch stops; a video the disk had no room for stops it too.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sagevideo.errors import BatchInterrupted, BatchStopped, InputError, Terminated
from sagevideo.generation.plan import BatchPlan
from sagevideo.host.deadline import JobTimeoutError
from sagevideo.host.pipeline_host import PlannedJob
from sagevideo.outputs.manifest import (
    MANIFEST_NAME,
    Manifest,
    ManifestRecord,
    ManifestWriteError,
    is_done,
    now_iso,
)

__all__ = ["BatchInterrupted", "BatchReport", "BatchStopped", "Terminated", "pending_jobs", "run_batch"]

log = logging.getLogger("sagevideo")


@dataclass
class BatchReport:
    """What a run did. records: one per planned job (the new record, or the done one it skipped;
    None for jobs an interrupt left unrun). retried: jobs that needed more than one attempt because
    a worker died. workers: where it ran, e.g. "2 Ray worker(s) on 1 node(s) of a local Ray
    instance" (None: this process). signal: "SIGINT" or "SIGTERM" when one interrupted the run.
    stopped: why the run stopped early on its own (the disk is full). kept: (output name, new
    name) of earlier renders of changed jobs that were renamed, not overwritten."""

    plan: BatchPlan
    records: list[ManifestRecord | None]
    done: int = 0
    skipped: int = 0
    failed: int = 0
    retried: int = 0
    interrupted: bool = False
    signal: str | None = None
    stopped: str | None = None
    kept: list[tuple[str, str]] = field(default_factory=list)
    workers: str | None = None
    attention: Counter = field(default_factory=Counter)  # backend label -> calls, e.g. "reference/fp16"
    fallbacks: Counter = field(default_factory=Counter)  # fallback reason -> calls
    # The recipe as the records saw it: first steps of the jobs it was applied for (compilation
    # lands there), and the step cache's forwards decided and skipped, summed over jobs.
    warmups: list[float] = field(default_factory=list)
    worker_starts: list[float] = field(default_factory=list)  # records' process_to_first_step_s
    cache_forwards: int = 0
    cache_skipped: int = 0
    graph_cache: Counter = field(default_factory=Counter)  # compiled graphs: "hit" (from the cache) / "miss" (not)

    @property
    def ok(self) -> bool:
        return self.failed == 0 and not self.interrupted and not self.stopped

    def add(self, index: int, record: ManifestRecord, echo: Callable[[str], None]) -> None:
        """Count one finished job (its record is final and in the manifest)."""
        self.records[index] = record
        if record.done:
            self.done += 1
        else:
            self.failed += 1
            echo(f"sagevideo: job {record.job_id} ({self.plan.jobs[index].label}) failed: {record.error}")
        if record.attempts > 1:
            self.retried += 1
        backends = record.backends or {}
        self.attention.update(backends.get("counts", {}))
        self.fallbacks.update(backends.get("fallbacks", {}))
        timings, recipe = record.timings or {}, record.recipe or {}
        if timings.get("recipe_s") is not None and timings.get("first_step_s") is not None:
            self.warmups.append(timings["first_step_s"])
        if timings.get("process_to_first_step_s") is not None:
            self.worker_starts.append(timings["process_to_first_step_s"])
        self.cache_forwards += recipe.get("cache_forwards") or 0
        self.cache_skipped += recipe.get("cache_skipped") or 0
        lookups = recipe.get("compile_cache_lookups") or {}
        # A graph the cache refused (bypass) was compiled afresh too: it counts as not from the cache.
        self.graph_cache.update(hit=lookups.get("fxgraph_cache_hit", 0),
                                miss=lookups.get("fxgraph_cache_miss", 0) + lookups.get("fxgraph_cache_bypass", 0))

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
        state = ""
        if self.interrupted:
            state = "terminated (SIGTERM) after " if self.signal == "SIGTERM" else "interrupted after "
        elif self.stopped:
            state = "stopped after "
        line = (
            f"sagevideo: {state}{self.done} done, {self.skipped} skipped, {self.failed} failed → "
            f"{self.plan.out} ({MANIFEST_NAME}); attention: {attention}"
        )
        line += self._recipe_part()
        if self.workers:
            line += f"; ran on {self.workers}"
        if self.retried:
            line += f"; {self.retried} job(s) retried after a worker died"
        if self.fallbacks:
            reasons = "; ".join(f"{reason} (x{n})" for reason, n in self.fallbacks.most_common())
            line += f"; SDPA fallbacks: {reasons}"
        if self.kept:
            shown = ", ".join(f"{name} → {kept}" for name, kept in self.kept[:3])
            more = f" and {len(self.kept) - 3} more" if len(self.kept) > 3 else ""
            line += f"; earlier renders of changed jobs kept, not overwritten: {shown}{more}"
        if self.stopped:
            line += f"; stopped: {self.stopped}"
        if self.interrupted or self.stopped:
            line += "; re-run the same command to resume"
        return line

    def _recipe_part(self) -> str:
        """'; recipe regional+fp8 (first step where applied: 24.5 s, compilation included; worker
        start to its first step: 40.1 s; 0 of 2 compiled graphs from the compile cache)', with the
        cache's skipped forwards; '' for a plain recipe."""
        recipe = self.plan.settings.recipe
        if recipe.is_plain:
            return ""
        notes = []
        if recipe.compile != "none" and self.warmups:
            notes.append(f"first step where applied: {max(self.warmups):.1f} s, compilation included")
        if recipe.compile != "none" and self.worker_starts:
            notes.append(f"worker start to its first step: {max(self.worker_starts):.1f} s")
        if sum(self.graph_cache.values()):
            notes.append(f"{self.graph_cache['hit']} of {sum(self.graph_cache.values())} compiled graphs "
                         "from the compile cache")
        if self.cache_forwards:
            notes.append(f"cache skipped {self.cache_skipped} of {self.cache_forwards} forwards")
        return f"; recipe {recipe.label()}" + (f" ({'; '.join(notes)})" if notes else "")


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
    joined or another run holds the output folder, BatchInterrupted on Ctrl-C or SIGTERM (after
    stopping the workers; finished jobs are recorded). A full disk ends the run early with
    `report.stopped` set.
    """
    from sagevideo.outputs.folders import FolderLock

    echo = echo or log.warning
    own = lock is None
    lock = FolderLock(plan.out, InputError) if own else lock
    with _sigterm_as_interrupt() as terminated:
        try:
            if own:
                lock.acquire(note=echo)
            try:
                return _run_locked(plan, progress=progress, echo=echo, execute=execute, terminated=terminated)
            finally:
                if own:
                    lock.release()
        except KeyboardInterrupt as stop:
            if isinstance(stop, BatchInterrupted):
                raise
            # Before any job was handed out (taking the lock): nothing to keep.
            report = BatchReport(plan=plan, records=[None for _ in plan.jobs], interrupted=True)
            report.signal = "SIGTERM" if isinstance(stop, Terminated) or terminated else "SIGINT"
            raise BatchInterrupted(report) from None


def _run_locked(
    plan: BatchPlan,
    *,
    progress: bool,
    echo: Callable[[str], None],
    execute: Callable[..., Iterator[tuple[int, ManifestRecord]]] | None,
    terminated: list[int] | None = None,
) -> BatchReport:
    """`run_batch` once the output folder is this run's. terminated: non-empty once SIGTERM came
    (a library between the handler and here may re-raise the interrupt as a plain KeyboardInterrupt)."""
    terminated = terminated if terminated is not None else []
    from tqdm.auto import tqdm
    from tqdm.contrib.logging import logging_redirect_tqdm

    manifest = Manifest(plan.manifest_path)
    for message in manifest.quarantine():  # torn or mistyped lines: said once, then set aside
        echo(f"sagevideo: {message}")
    report = BatchReport(plan=plan, records=[])
    records = manifest.records()
    todo: list[tuple[int, PlannedJob]] = []
    for index, (pj, previous) in enumerate(zip(plan.jobs, _previous_records(records, plan), strict=True)):
        if previous is not None:
            report.skipped += 1
            report.records.append(previous)
        else:
            todo.append((index, pj))
            report.records.append(None)  # filled in as jobs finish, keeping plan order
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
    committer = _Committer(plan, manifest, records, report, echo)
    # Library warnings (e.g. diffusers' prompt truncation) print above the bar, not through it.
    libraries = [logging.getLogger(name) for name in ("diffusers", "transformers")]
    try:
        with logging_redirect_tqdm(loggers=libraries, tqdm_class=tqdm):
            for index, record in results:
                with _signals_deferred(terminated):  # a video's rename and its manifest line go together
                    committer.finish(index, record)
                bar.update(1)
                if report.stopped:
                    break
    except KeyboardInterrupt as stop:
        report.interrupted = True
        report.signal = "SIGTERM" if isinstance(stop, Terminated) or terminated else "SIGINT"
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
    previous = _previous_records(Manifest(plan.manifest_path).records(), plan)
    return [(index, pj) for index, (pj, record) in enumerate(zip(plan.jobs, previous, strict=True)) if record is None]


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


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[list[int]]:
    """For the whole run, SIGTERM raises `Terminated` (a KeyboardInterrupt) in the main thread, so
    it stops the batch the way Ctrl-C does: workers stopped, summary, resume hint. Yields the list
    the signal is also noted in: inside Ray's blocking calls (`ray.wait`, `ray.get`) an exception
    raised by a signal handler comes out as a plain KeyboardInterrupt (its C++ core reports the
    handler's error as "interrupted"), and the exit status must still say SIGTERM (143)."""
    terminated: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield terminated  # signal handlers live in the main thread only
        return

    def stop(signum: int, frame: Any) -> None:
        terminated.append(signum)
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield terminated
    finally:
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)


@contextlib.contextmanager
def _signals_deferred(terminated: list[int]) -> Iterator[None]:
    """Hold Ctrl-C and SIGTERM for the few milliseconds of a commit, then raise them: an interrupt
    then never leaves a video under its final name without its manifest record, or a record uncounted."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers live in the main thread only
        return
    caught: list[int] = []
    hold = lambda signum, frame: caught.append(signum)
    previous = {signum: signal.signal(signum, hold) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            # None: the old handler was not set from Python; Python's own is the sane one to restore.
            default = signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL
            signal.signal(signum, handler if handler is not None else default)
        if signal.SIGTERM in caught:
            terminated.append(signal.SIGTERM)
            raise Terminated()
        if caught:
            raise KeyboardInterrupt


class _Committer:
    """The driver's end of a job: its outputs into place and its manifest line, together.

    owners: output name -> the latest done record that wrote it (the manifest's say on whose
    video a file is), kept up to date as jobs finish."""

    def __init__(
        self,
        plan: BatchPlan,
        manifest: Manifest,
        records: list[ManifestRecord],
        report: BatchReport,
        echo: Callable[[str], None],
    ):
        self.plan, self.manifest, self.report, self.echo = plan, manifest, report, echo
        self.owners = _owners(records)

    def finish(self, index: int, record: ManifestRecord) -> None:
        """Commit and record one finished job and count it; sets `report.stopped` when the batch
        cannot go on (the manifest cannot be written, or the disk is full)."""
        pj = self.plan.jobs[index]
        handoff = record.handoff
        staged = [(handoff and handoff.staged_frames, pj.frames_dir), (handoff and handoff.staged, pj.output)]
        record = record.replace(handoff=None)  # the worker's word to the driver ends here
        committed: list[tuple[Path, Path]] = []
        try:
            if record.done:
                record = self._into_place(pj, record, staged, committed)
            self.manifest.append(record)
        except ManifestWriteError as err:
            for final, staged_path in reversed(committed):  # a final name holds only what the manifest vouches for
                with contextlib.suppress(OSError):
                    os.replace(final, staged_path)
            self.report.stopped = f"{err}; no later job could be recorded"
            self.echo(f"sagevideo: {err}; stopping (job {pj.job_id} is not recorded and runs again on a re-run)")
            return
        self.report.add(index, record, self.echo)
        if record.done:
            self.owners.update(dict.fromkeys(record.outputs, record))
        if handoff is not None and handoff.storage_full:
            self.report.stopped = f"{record.error}; later jobs would fail the same way, so the batch stopped"

    def _into_place(
        self, pj: PlannedJob, record: ManifestRecord, staged: list[tuple[Any, str | None]], committed: list
    ) -> ManifestRecord:
        """Give a done job's staged video (and PNG folder) its final names, after renaming aside any
        other job's output there; the record becomes the manifest line. The folder goes first: the
        mp4's name is the one a re-run trusts. committed: (final, staged) of each rename made."""
        from sagevideo.outputs.staging import commit, commit_folder

        out = self.plan.out
        try:
            self._keep_others(pj)
            for staged_name, final_name in staged:
                if final_name is None:
                    continue
                final, staged_path = out / final_name, out / str(staged_name)
                (commit_folder if final_name == pj.frames_dir else commit)(staged_path, final)
                committed.append((final, staged_path))
        except OSError as err:
            return record.replace(
                status="failed",
                error=(
                    f"the finished video {pj.output} could not be moved into place ({err.strerror or err}); "
                    "with several machines, --out must be a folder every node shares"
                ),
            )
        return record.replace(outputs=pj.outputs)

    def _keep_others(self, pj: PlannedJob) -> None:
        """Rename aside what another job (or no recorded job) left under this job's output names;
        another job's outputs move together, and its record is appended again naming their new place."""
        from sagevideo.outputs.staging import keep_aside

        out = self.plan.out
        for name in pj.outputs:
            if not (out / name).exists():
                continue  # (or moved aside just now with the rest of its job's outputs)
            owner = self.owners.get(name)
            if owner is not None and owner.job_id == pj.job_id:
                continue  # this job's own earlier render (e.g. its PNG folder was missing): same inputs
            if owner is None:
                moved = {name: keep_aside(out / name, "unrecorded").name}
                what = "a file no manifest record vouches for"
            else:
                names = [n for n in owner.outputs if self.owners.get(n) is owner and (out / n).exists()]
                moved = {n: keep_aside(out / n, owner.job_id[:10]).name for n in names}
                what = f"the render of job {owner.job_id} ({str(owner.prompt)[:40]!r})"
                kept_record = owner.replace(outputs=[moved.get(n, n) for n in owner.outputs], created=now_iso())
                try:
                    self.manifest.append(kept_record)
                except ManifestWriteError:
                    for n, kept in moved.items():  # back where its record says it is
                        with contextlib.suppress(OSError):
                            os.rename(out / kept, out / n)
                    raise
                for n in moved:
                    del self.owners[n]
                self.owners.update(dict.fromkeys(kept_record.outputs, kept_record))
            for old, kept in moved.items():
                self.report.kept.append((old, kept))
                self.echo(f"sagevideo: {old} held {what}; {pj.label} now writes {name}, so it is kept as {kept}")


def _owners(records: list[ManifestRecord]) -> dict[str, ManifestRecord]:
    """Output name -> the latest done record that names it (a later one wrote over an earlier one)."""
    owners: dict[str, ManifestRecord] = {}
    for r in records:
        if r.done:
            for name in r.outputs:
                owners[name] = r
    return owners


def _previous_records(records: list[ManifestRecord], plan: BatchPlan) -> list[ManifestRecord | None]:
    """Per planned job: its latest record if that says done, names the outputs the plan expects,
    they are present and no later done job wrote them (a changed job with the same output name)."""
    latest = {r.job_id: r for r in records}
    owners = _owners(records)
    found = []
    for pj in plan.jobs:
        previous = latest.get(pj.job_id)
        ok = (
            is_done(previous, plan.out)
            and previous.outputs == pj.outputs
            and all(owners.get(name) is previous for name in pj.outputs)
        )
        found.append(previous if ok else None)
    return found
