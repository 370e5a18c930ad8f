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
import os
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sagevideo.errors import BatchInterrupted, BatchStopped, InputError, Terminated
from sagevideo.generation.plan import BatchPlan
from sagevideo.generation.resume import Stale, decide, owners
from sagevideo.generation.signals import StopSignals, signal_name, stop_signals
from sagevideo.host.deadline import JobTimeoutError
from sagevideo.host.pipeline_host import PlannedJob
from sagevideo.outputs.manifest import MANIFEST_NAME, Manifest, ManifestRecord, ManifestWriteError, now_iso

__all__ = ["BatchInterrupted", "BatchReport", "BatchStopped", "Terminated", "pending_jobs", "run_batch"]

log = logging.getLogger("sagevideo")


@dataclass
class BatchReport:
    """What a run did. records: one per planned job (the new record, or the done one it skipped;
    None for jobs an interrupt left unrun). retried: jobs that needed more than one attempt because
    a worker died. workers: where it ran, e.g. "2 Ray worker(s) on 1 node(s) of a local Ray
    instance" (None: this process). signal: "SIGINT", "SIGTERM" or "SIGHUP" when one interrupted the run.
    stopped: why the run stopped early on its own (the disk is full). kept: (output name, new
    name) of earlier renders of changed jobs that were renamed, not overwritten. stale: earlier
    renders of jobs rendered again because the model changed. reused: (job id, `reused`) of each
    job done without rendering (made from a finished render of the same video)."""

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
    stale: list[Stale] = field(default_factory=list)
    reused: list[tuple[str, dict[str, Any]]] = field(default_factory=list)  # (job id, its record's `reused`)
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
        if record.reused is not None:  # no attention ran for it here
            self.reused.append((record.job_id, dict(record.reused)))
            return
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
            state = "interrupted after " if self.signal == "SIGINT" else f"terminated ({self.signal}) after "
        elif self.stopped:
            state = "stopped after "
        line = (
            f"sagevideo: {state}{self.done} done, {self.skipped} skipped, {self.failed} failed → "
            f"{self.plan.out} ({MANIFEST_NAME}); attention: {attention}"
        )
        line += self._recipe_part()
        line += self._reuse_part()
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

    def _reuse_part(self) -> str:
        """'; 2 of them not rendered again: 1 made from another job's identical video (1 hard link), 1
        with PNG frames decoded from the finished mp4', then '; 3 earlier render(s) stale, ...'; or ''."""
        line = ""
        if self.reused:
            other = [reused for job, reused in self.reused if reused.get("job_id") != job]
            how = Counter("hard link" if r.get("video") == "hardlink" else str(r.get("video")) for r in other)
            parts = []
            if other:
                links = ", ".join(f"{n} {kind}" for kind, n in how.most_common())
                parts.append(f"{len(other)} made from another job's identical video ({links})")
            decoded = sum(1 for _, reused in self.reused if reused.get("frames") == "decoded")
            if decoded:
                parts.append(f"{decoded} with PNG frames decoded from the finished mp4")
            line += f"; {len(self.reused)} of them not rendered again: " + ", ".join(parts)
        if self.stale:
            line += "; " + stale_text(self.stale, self.plan.source.fingerprint)
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


def stale_text(stale: list[Stale], fingerprint: str) -> str:
    """Why earlier renders render again, e.g. '2 earlier render(s) stale, rendered again: the model
    changed since (fingerprint 1a2b3c4d5e6f, now 0f9e8d7c6b5a: its weights or configs differ)'."""
    parts = []
    changed = [s.record for s in stale if s.why == "model"]
    if changed:
        old = ", ".join(sorted({str(r.model_fingerprint) for r in changed}))
        parts.append(f"{len(changed)} earlier render(s) stale, rendered again: the model changed since (fingerprint "
                     f"{old}, now {fingerprint}: its weights or configs differ)")
    unverified = sum(1 for s in stale if s.why == "unverified")
    if unverified:
        parts.append(f"{unverified} earlier render(s) rendered again: recorded by a sagevideo whose model fingerprint "
                     "did not cover weight contents, so a changed model could not be ruled out")
    return "; ".join(parts)


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

    manifest = Manifest(plan.manifest_path)
    newer = manifest.newer_schema_problem()  # planned before a newer sagevideo wrote there
    if newer:
        raise InputError(f"--out {plan.out}: {newer}")
    for message in manifest.quarantine():  # torn or mistyped lines: said once, then set aside
        echo(f"sagevideo: {message}")
    report = BatchReport(plan=plan, records=[])
    records = manifest.records()
    resume = decide(plan, records)
    report.stale = resume.stale
    todo: list[tuple[int, PlannedJob]] = []
    from_finished: list[tuple[int, ManifestRecord]] = []  # (index, the finished render it is made from)
    followers: dict[int, list[int]] = {}  # index of a job rendered here -> jobs made from its video
    for index, (pj, decision) in enumerate(zip(plan.jobs, resume.decisions, strict=True)):
        report.records.append(decision.record if decision.kind == "skip" else None)  # None: filled in as jobs finish
        if decision.kind == "skip":
            report.skipped += 1
        elif decision.kind == "reuse":
            from_finished.append((index, decision.record))
        elif decision.kind == "follow":
            followers.setdefault(decision.leader, []).append(index)
        else:
            todo.append((index, pj))
    open_jobs = [pj for pj, decision in zip(plan.jobs, resume.decisions, strict=True) if decision.kind != "skip"]
    if not open_jobs:
        return report
    if report.stale:
        echo(f"sagevideo: {stale_text(report.stale, plan.source.fingerprint)}")
    for pj in open_jobs:  # what a killed earlier run may have left (hidden files only)
        pj.remove_leftovers(plan.out)

    bar = tqdm(
        total=len(plan.jobs),
        initial=report.skipped,
        disable=not progress,
        unit="video",
        desc="sagevideo",
        dynamic_ncols=True,
    )

    def status(text: str) -> None:
        signals.check()  # a stop signal whose exception was lost on its way stops the run here
        bar.set_postfix_str(text[:40], refresh=True)

    committer = _Committer(plan, manifest, records, report, echo)
    results = None
    # Library warnings (e.g. diffusers' prompt truncation) print above the bar, not through it.
    libraries = [logging.getLogger(name) for name in ("diffusers", "transformers")]
    try:
        with logging_redirect_tqdm(loggers=libraries, tqdm_class=tqdm):
            for index, source in from_finished:  # no model needed: before any load
                status(plan.jobs[index].output)
                committer.made_from(index, source, signals)
                bar.update(1)
                if report.stopped:
                    break
            if todo and not report.stopped:
                if execute is not None:
                    results = execute(plan, todo, status)
                elif plan.use_ray:
                    from sagevideo.scheduling import run_jobs

                    results = run_jobs(plan, todo, status=status, echo=echo, report=report)
                else:
                    results = _run_here(plan, todo, status)
                for index, record in results:
                    if not record.done:
                        signals.check()  # a job that failed after a stop signal: the signal may be why; not recorded
                    with signals.held():  # a video's rename and its manifest line go together
                        committer.finish(index, record)
                    bar.update(1)
                    for follower in followers.get(index, []):
                        if report.stopped:
                            break
                        committer.follow(follower, index, signals)
                        bar.update(1)
                    if report.stopped:
                        break
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
        for pj in open_jobs:
            pj.remove_leftovers(plan.out)
    return report


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
        self.owners = owners(records)

    def made_from(self, index: int, source: ManifestRecord, signals: StopSignals) -> None:
        """Make and commit a job from a finished render of the same video (no model)."""
        from sagevideo.generation.reuse import made_from

        record = made_from(self.plan, self.plan.jobs[index], source, self.owners)  # slow part: signals as usual
        with signals.held():
            self.finish(index, record)

    def follow(self, index: int, leader: int, signals: StopSignals) -> None:
        """Make a job from the video its leader (a job of this run with the same render key) just
        committed, or record it failed with the leader."""
        from sagevideo.generation.reuse import not_made

        rendered = self.report.records[leader]
        if rendered is not None and rendered.done:
            self.made_from(index, rendered, signals)
            return
        record = not_made(self.plan, self.plan.jobs[index], self.plan.jobs[leader], rendered)
        with signals.held():
            self.finish(index, record)

    def finish(self, index: int, record: ManifestRecord) -> None:
        """Commit and record one finished job and count it; sets `report.stopped` when the batch
        cannot go on (the manifest cannot be written, or the disk is full)."""
        pj = self.plan.jobs[index]
        handoff = record.handoff
        staged = [(handoff and handoff.staged_frames, pj.frames_dir), (handoff and handoff.staged, pj.output)]
        if handoff is not None and handoff.in_place:  # made from finished files: the unstaged ones are in place
            staged = [(name, final) for name, final in staged if name is not None]
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
            if owner is not None and pj.render_key is not None and owner.render_key == pj.render_key:
                continue  # the same video under this name (another job's name or settings spelt otherwise)
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
