"""The folders of one `sagevideo ab` run, claimed before its first arm runs.

`claim_arm_folders` takes every arm folder's lock (`sagevideo.outputs.folders.FolderLock`) and
holds them while the arms run, refuses an arm folder that holds what ab did not make there (a
`generate` run's videos and manifest: ab would set them aside and render the arm again), then
marks the run's folder and each arm's (`mark_ab_folder`), which `generate` then refuses as its
--out. Everything is checked before anything runs, so a locked or foreign third arm is said at
once, not after two arms rendered; every problem is listed together (exit 2).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from sagevideo.errors import InputError


class ArmFolders(contextlib.AbstractContextManager):
    """The arm folders of an ab run that `claim_arm_folders` claimed: `lock(folder)` is this run's
    FolderLock on it, for `run_batch(lock=...)`; every lock is released on leaving the `with` block."""

    def __init__(self, stack: contextlib.ExitStack, locks: dict[Path, Any]):
        self._stack, self._locks = stack, locks

    def lock(self, folder: Path) -> Any:
        return self._locks.get(folder)

    def __exit__(self, *exc: object) -> None:
        self._stack.close()


def claim_arm_folders(out: Path, batches: Iterable[Any], echo: Callable[[str], None]) -> ArmFolders:
    """Lock every arm folder of `batches` (`BatchPlan`s whose `out` lies under `out`, the run's
    folder), check that none holds what ab did not make there, then mark the run's folder and each
    arm's as ab's. InputError naming each locked, foreign or other-ab folder, with nothing marked
    or held."""
    from sagevideo.outputs.folders import FolderLock, ab_arm_of, mark_ab_folder

    batches = list(batches)
    problems = []
    if ab_arm_of(out) not in (None, ""):
        problems.append(_other_run(out, ""))
    stack = contextlib.ExitStack()
    locks: dict[Path, Any] = {}
    for batch in batches:
        lock = FolderLock(batch.out, InputError)
        try:
            lock.acquire(note=echo)
        except InputError as err:  # another run writes there now
            problems.append(str(err))
            continue
        stack.callback(lock.release)
        locks[batch.out] = lock  # on a file system without locks, one that holds nothing (acquire said so)
    for batch in batches:
        problem = _foreign(batch, batch.out.relative_to(out).as_posix())
        if problem:
            problems.append(problem)
    try:
        if problems:
            raise InputError("\n".join(problems))
        try:
            mark_ab_folder(out, "")
            for batch in batches:
                mark_ab_folder(batch.out, batch.out.relative_to(out).as_posix())
        except OSError as err:
            raise InputError(f"--out {out}: cannot write there ({err.strerror or err}); give a writable "
                             "folder") from None
    except BaseException:
        stack.close()
        raise
    return ArmFolders(stack, locks)


def _foreign(batch: Any, arm: str) -> str | None:
    """Why ab cannot render arm `arm` into batch.out: it is another ab run's folder, or it holds
    videos or records ab did not make there (jobs it does not plan, files no record names); None
    for an empty folder, one ab marked, or one whose records are all this arm's jobs (the same
    videos: an earlier ab's, or a generate with exactly the arm's settings)."""
    from sagevideo.outputs.folders import ab_arm_of
    from sagevideo.outputs.manifest import Manifest

    marked = ab_arm_of(batch.out)
    if marked is not None:
        return None if marked == arm else _other_run(batch.out, arm)
    records = Manifest(batch.manifest_path).records() if batch.manifest_path.is_file() else []
    planned = {pj.job_id for pj in batch.jobs}
    others = {r.job_id for r in records if r.job_id not in planned}
    named = {output for r in records for output in r.outputs}
    stray = sorted(p.name for p in batch.out.glob("*.mp4") if p.name not in named)
    if not others and not stray:
        return None
    what = []
    if others:
        what.append(f"{len(others)} job(s) in its manifest.jsonl that this arm does not run")
    if stray:
        what.append(f"{len(stray)} video(s) no record names ({stray[0]}{', ...' if len(stray) > 1 else ''})")
    return (f"--out {batch.out}: the {arm!r} arm's folder holds {' and '.join(what)}: not made by `sagevideo ab` "
            f"(e.g. `sagevideo generate --out {batch.out}`); ab would set them aside and render the arm again, so "
            "move them elsewhere, or give ab another --out")


def _other_run(folder: Path, arm: str) -> str:
    from sagevideo.outputs.folders import ab_arm_of

    marked = ab_arm_of(folder)
    other = "the folder of another `sagevideo ab` run" if marked == "" else f"the {marked!r} arm of another ab run"
    this = "this run's folder" if arm == "" else f"this run's {arm!r} arm"
    return f"--out {folder}: is {other}, not {this}; give this ab another --out"
