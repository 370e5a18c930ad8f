"""The driver's end of a job: its outputs renamed into place and its manifest line, together.

`Committer.finish(index, record)` takes a job's record as a worker handed it back (its
`handoff` naming the staged files), renames the staged mp4 (and PNG folder) to their final
names, after setting aside whatever another job left under them, and appends the record to the
manifest; if the line cannot be written the renames are undone, so a final name holds only
what the manifest vouches for. `made_from` and `follow` make a job from a finished render of the
same video instead (`sagevideo.generation.reuse`). This process is the only writer of final
names and of the manifest, however many workers run.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sagevideo.generation.plan import BatchPlan
from sagevideo.generation.report import BatchReport
from sagevideo.generation.resume import owners
from sagevideo.generation.signals import StopSignals
from sagevideo.host.pipeline_host import PlannedJob
from sagevideo.outputs.manifest import Manifest, ManifestRecord, ManifestWriteError, now_iso

__all__ = ["Committer"]


class Committer:
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
