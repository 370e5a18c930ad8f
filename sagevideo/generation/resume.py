"""What a run does with each planned job, decided from the manifest alone (no model, no file written).

`decide(plan, records)` gives each job, in plan order, one `Decision`:
- "skip": its own latest record is done and every output it asks for is there and still its own;
- "reuse": a done record of the same video (the same render key: prompt, seed, settings and model
  content) has its mp4 there, so this job is made from it without rendering (`generation.reuse`):
  the job's own record when it now asks for PNG frames too, or another job's (the same prompt,
  seed and settings under another name);
- "follow": an earlier job of the plan renders the same video in this run; this one is made from
  it once that one is done (or fails with it);
- "render": the rest, the only jobs a model is loaded for.
It also lists the `Stale` records: earlier renders of jobs that now render again because the
model is not the one that made them (its fingerprint changed), or because they were recorded
before fingerprints covered weight contents, so that could not be ruled out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from sagevideo.host.pipeline_host import PlannedJob
from sagevideo.outputs.manifest import ManifestRecord

Kind = Literal["skip", "reuse", "follow", "render"]


@dataclass(frozen=True)
class Decision:
    """kind: see the module docstring. record: skip: the job's record; reuse: the finished render
    it is made from. leader: follow: the plan index of the job that renders its video."""

    kind: Kind
    record: ManifestRecord | None = None
    leader: int | None = None


@dataclass(frozen=True)
class Stale:
    """An earlier render of a job that renders again. why: "model" (another model fingerprint
    made it) or "unverified" (recorded before fingerprints covered weight contents)."""

    record: ManifestRecord
    why: Literal["model", "unverified"]


@dataclass
class Resume:
    decisions: list[Decision]
    stale: list[Stale] = field(default_factory=list)

    def rendered(self, jobs: list[PlannedJob]) -> list[tuple[int, PlannedJob]]:
        """(plan index, job) of the jobs to render."""
        return [(i, pj) for i, (pj, d) in enumerate(zip(jobs, self.decisions, strict=True)) if d.kind == "render"]


def owners(records: list[ManifestRecord]) -> dict[str, ManifestRecord]:
    """Output name -> the latest done record that names it (a later one wrote over an earlier one)."""
    found: dict[str, ManifestRecord] = {}
    for r in records:
        if r.done:
            for name in r.outputs:
                found[name] = r
    return found


def decide(plan: Any, records: list[ManifestRecord]) -> Resume:
    """The decision for each job of `plan` (a BatchPlan) given the manifest's records, and the stale ones."""
    latest = {r.job_id: r for r in records}
    owned = owners(records)
    sources = _sources(latest.values(), owned, plan.out)
    decisions: list[Decision] = []
    rendering: dict[str, int] = {}  # render key -> plan index of the job that renders it
    for index, pj in enumerate(plan.jobs):
        previous = latest.get(pj.job_id)
        if _complete(previous, pj, owned, plan.out):
            decisions.append(Decision("skip", previous))
            continue
        source = _source_for(pj, sources, owned, plan.out)
        if source is not None:
            decisions.append(Decision("reuse", source))
        elif pj.render_key is not None and pj.render_key in rendering:
            decisions.append(Decision("follow", leader=rendering[pj.render_key]))
        else:
            decisions.append(Decision("render"))
            if pj.render_key is not None:
                rendering[pj.render_key] = index
    rendered = [pj for pj, d in zip(plan.jobs, decisions, strict=True) if d.kind == "render"]
    return Resume(decisions, _stale(rendered, latest, plan.source.fingerprint, plan.out))


def _complete(previous: ManifestRecord | None, pj: PlannedJob, owned: dict[str, ManifestRecord], out: Path) -> bool:
    """Done, and every output the job asks for is there and was last written by this record (it
    may list more: PNG frames the job no longer asks for)."""
    return (
        previous is not None
        and previous.done
        and all(name in previous.outputs and (out / name).exists() and owned.get(name) is previous
                for name in pj.outputs)
    )


def _sources(latest: Any, owned: dict[str, ManifestRecord], out: Path) -> dict[str, list[ManifestRecord]]:
    """Render key -> done records whose mp4 is there and still theirs, newest first."""
    found: dict[str, list[ManifestRecord]] = {}
    for r in sorted(latest, key=lambda r: r.created or "", reverse=True):
        video = r.video
        if r.done and r.render_key and video and owned.get(video) is r and (out / video).is_file():
            found.setdefault(r.render_key, []).append(r)
    return found


def _source_for(
    pj: PlannedJob, sources: dict[str, list[ManifestRecord]], owned: dict[str, ManifestRecord], out: Path
) -> ManifestRecord | None:
    """The finished render to make this job from: its own record first (only PNG frames are
    missing), then one that already has the PNG frames the job asks for, then the newest."""
    found = sources.get(pj.render_key or "", [])
    if not found:
        return None
    own = [r for r in found if r.job_id == pj.job_id]
    with_frames = [r for r in found if pj.frames_dir and frames_of(r, owned, out)]
    return (own or with_frames or found)[0]


def frames_of(record: ManifestRecord, owned: dict[str, ManifestRecord], out: Path) -> str | None:
    """The record's PNG frames folder when it is there and still its own, else None."""
    for name in record.outputs:
        if name != record.video and owned.get(name) is record and (out / name).is_dir():
            return name
    return None


def _stale(
    rendered: list[PlannedJob], latest: dict[str, ManifestRecord], fingerprint: str, out: Path
) -> list[Stale]:
    """Done records (their mp4 still there) that are these jobs under another model state: for
    each (scheme, model, fingerprint) the records show, the id each job would have had there."""
    done = {r.job_id: r for r in latest.values() if r.done and r.video and (out / r.video).is_file()}
    models = {(r.render_key is None, r.model, r.model_fingerprint) for r in done.values()}
    models = {(legacy, model, old) for legacy, model, old in models if legacy or old != fingerprint}
    found: list[Stale] = []
    for pj in rendered:
        if pj.identity is None:
            continue
        for legacy, model, old in sorted(models, key=str):
            jid = pj.identity.legacy_id(model, old) if legacy else pj.identity.id_under(old)
            record = done.get(jid)
            if record is not None and jid != pj.job_id:
                found.append(Stale(record, "unverified" if legacy else "model"))
    return found
