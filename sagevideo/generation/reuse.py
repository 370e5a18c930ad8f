"""Make a job from a finished render of the same video, in the driver, without the model.

`made_from(plan, pj, source, owned)` stages the job's outputs from `source` (a done record of the
same render key whose mp4 is in the output folder; `generation.resume` picks it) and returns the
job's record with a `Handoff` for the committer, exactly like a worker's: the mp4 hard-linked (or
copied) to a staged name of the job's own, or kept when it already has the job's name; the PNG
frames, when the job asks for them, hard-linked from the source's folder or decoded from the
mp4 (`outputs.video.read_frames`: the frames the mp4 holds, as a viewer sees them). The record
is the job's own (`host.pipeline_host.base_record`) with what made the pixels taken from the
source (backends, recipe, scheduler, device) and `reused` saying how it was made. A failure
(disk full, an mp4 that does not decode) makes a failed record, as a failed render would; a run
that resumes a torchrun group must not render a job the other ranks did not plan to.
"""

from __future__ import annotations

import time
from typing import Any

from sagevideo.generation.resume import frames_of
from sagevideo.host.pipeline_host import PlannedJob, base_record, worker_info
from sagevideo.outputs.manifest import Handoff, ManifestRecord, now_iso


def made_from(plan: Any, pj: PlannedJob, source: ManifestRecord, owned: dict[str, ManifestRecord]) -> ManifestRecord:
    """The record of `pj` (a job of `plan`, a BatchPlan) made from `source`; see the module docstring."""
    from sagevideo.outputs.staging import stage_copy, stage_folder_copy, staged_path
    from sagevideo.outputs.video import STORAGE_FULL, VideoWriteError, read_frames, write_frames_png

    out = plan.out
    record = base_record(plan.context(), pj)
    record.worker, record.started = worker_info(), now_iso()
    record.backends, record.recipe, record.scheduler = source.backends, source.recipe, source.scheduler
    record.device = source.device
    reused: dict[str, Any] = {"job_id": source.job_id, "video": "kept", "frames": None}
    handoff: dict[str, Any] = {"in_place": True}
    start = time.perf_counter()
    try:
        if source.video != pj.output:
            staged, reused["video"] = stage_copy(out / source.video, out / pj.output)
            handoff["staged"] = staged.name
        if pj.frames_dir:
            frames = frames_of(source, owned, out)
            if frames == pj.frames_dir:
                reused["frames"] = "kept"
            elif frames is not None:
                staged, reused["frames"] = stage_folder_copy(out / frames, out / pj.frames_dir)
                handoff["staged_frames"] = staged.name
            else:
                try:
                    decoded = read_frames(out / source.video)
                except Exception as err:  # the decoder's errors are its own types
                    raise VideoWriteError(
                        f"{pj.frames_dir}: PNG frames not written: {source.video} does not decode ({err}); "
                        f"delete {source.video} to render the job again"
                    ) from None
                pngs = write_frames_png(decoded, staged_path(out / pj.frames_dir), name=pj.frames_dir)
                handoff["staged_frames"], reused["frames"] = pngs.name, "decoded"
        record.status, record.reused = "done", reused
    except (OSError, VideoWriteError) as err:
        code = err.errno
        record.status, record.error = "failed", f"{type(err).__name__}: {err}"
        handoff["storage_full"] = code in STORAGE_FULL
    record.timings = {"write_s": round(time.perf_counter() - start, 4)}
    record.created = now_iso()
    record.handoff = Handoff(**handoff)
    return record


def not_made(plan: Any, pj: PlannedJob, leader: PlannedJob, failed: ManifestRecord) -> ManifestRecord:
    """The failed record of a job whose video `leader` was to render in this run, and did not."""
    record = base_record(plan.context(), pj)
    record.status, record.created = "failed", now_iso()
    record.error = f"not rendered: {leader.label} makes the same video and failed ({failed.error})"
    return record
