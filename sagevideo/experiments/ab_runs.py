"""The runs of one `sagevideo ab`, apart from its options: the job file's check, the arms run one
after another in their claimed folders, the quantized arm's plan check and attention probe, and
what metrics.json says of the run.

`sagevideo.experiments.ab` composes these for the quantized-vs-full run and for recipe arms
(`--arm`); the options (`ABConfig`) stay there.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sagevideo.errors import ABFailed, InputError
from sagevideo.jobs.files import fields_set_in
from sagevideo.outputs.manifest import ManifestRecord

ARM_FIELDS = ("attention", "pv", "plan")  # what ab sets per arm, so a job file must not


def checked_job_file(job_file: Path, why: str) -> Path:
    """The job file, after checking that it exists and sets none of `ARM_FIELDS`; InputError naming
    where it sets them, `why` saying what ab does instead."""
    job_file = job_file.expanduser()
    if not job_file.is_file():
        raise InputError(f"JOB_FILE {job_file}: no such file")
    arm_fields = fields_set_in(job_file, ARM_FIELDS)
    if arm_fields:
        raise InputError(f"JOB_FILE {job_file} sets {', '.join(arm_fields)}: {why}; remove them from the job file")
    return job_file


def arm_settings(config: Any) -> dict[str, Any]:
    """The settings every arm shares: model, backend, device, and the input image (every arm plans
    the same files, so every arm starts from the same images)."""
    common: dict[str, Any] = {"model": config.model, "backend": config.backend, "device": config.device}
    if config.image is not None:
        common["image"] = config.image
    return common


def run_arms(runs: list[tuple[str, str, Path, Any]], arm_folders: Any, *, progress: bool,
             echo: Callable[[str], None]) -> dict[str, list[ManifestRecord]]:
    """Run each (key, label, folder, batch) in turn under its claimed folder's lock (`arm_folders`:
    `claim_arm_folders`'); {key: the arm's records}. ABFailed at the first arm with a failed job
    (its manifest named; re-running resumes)."""
    from sagevideo.generation.generate import run_batch

    records: dict[str, list[ManifestRecord]] = {}
    for key, label, folder, batch in runs:
        echo(f"sagevideo ab: {label} arm -> {folder}")
        for note in batch.notes:
            if note.startswith("plan "):  # e.g. a plan calibrated for another step count
                echo(f"sagevideo ab: {note}")
        recs = run_batch(batch, progress=progress, lock=arm_folders.lock(batch.out)).records
        failed = [r for r in recs if not r.done]
        if failed:
            raise ABFailed(f"{len(failed)} job(s) of the {label} arm failed (first: {failed[0].error}); see "
                           f"{folder / 'manifest.jsonl'}; re-running the same command resumes")
        records[key] = recs
    return records


def expected_calls(plan: Any, steps: int) -> Counter | None:
    """Calls per precision ("full", "fp16", "fp8") a plan implies for one job, or None when the plan
    does not list its layers (then only the set of precisions can be compared)."""
    if plan.layers is None:
        return None
    counts: Counter = Counter()
    for step in range(steps):
        for layer in plan.layers:
            counts[plan.choice_for(layer, step).mode.pv or "full"] += 1
    return counts


def plan_check(plan: Any, records: list[ManifestRecord]) -> dict[str, Any]:
    """Compare the quantized arm's recorded attention calls with what `plan` implies.

    `backends.counts` labels ("reference/fp16", "triton/fp8", "sdpa") are reduced to their
    precision; granularity is not recorded, so block/token differences cannot be seen.
    """
    problems = []
    for r in records:
        ran: Counter = Counter()
        backends = r.backends or {}
        for label, n in (backends.get("counts") or {}).items():
            ran[label.split("/", 1)[1] if "/" in label else "full"] += n
        fallbacks = backends.get("fallbacks") or {}
        expected = expected_calls(plan, int(r.steps or 0))
        prompt = str(r.prompt)[:40]
        if expected is not None:
            if ran != expected and not fallbacks:
                problems.append(
                    f"{prompt!r}: ran {dict(sorted(ran.items()))}, the plan implies {dict(sorted(expected.items()))}"
                )
        else:
            modes = {c.mode.pv or "full" for c in [plan.default, *(o.choice for o in plan.overrides)]}
            if not set(ran) <= modes:
                problems.append(f"{prompt!r}: ran {sorted(ran)}, the plan has only {sorted(modes)}")
    consistent = not problems
    message = (
        "the quantized arm's recorded attention calls match the plan (per precision)"
        if consistent
        else "the quantized arm's recorded attention calls do not match the plan (did the generator record the "
        "plan without applying it?): " + "; ".join(problems[:3])
    )
    return {"consistent": consistent, "message": message, "problems": problems}


def checked_plan(plan: Any, records: list[ManifestRecord], test_dir: Path, notes: list[str]) -> dict[str, Any]:
    """`plan_check` of the quantized arm, its line added to `notes`; ABFailed when the arm did not
    run the plan (evaluating it as if it had would mislead)."""
    check = plan_check(plan, records)
    notes.append(f"plan check ({test_dir.name}/): {check['message']}")
    if not check["consistent"]:
        raise ABFailed(f"{check['message']}; see {test_dir / 'manifest.jsonl'}")
    return check


def probed(records: list[ManifestRecord], test_dir: Path, plan: Any, model: str, notes: list[str],
           echo: Callable[[str], None], shown: Callable[[str], None] | None) -> dict[str, Any]:
    """The attention probe of the quantized arm: its jobs re-run with a probing router
    (`probe.rerun_arm`); warnings (not reproduced exactly, layers too peaky for INT8) added to
    `notes` and echoed. ABFailed when the re-run cannot run."""
    from sagevideo.experiments.probe import ProbeRunError, rerun_arm

    echo("sagevideo ab: attention probe: re-running the quantized jobs with a probing router")
    try:
        probe = rerun_arm(records, arm_dir=test_dir, plan=plan, model=model, probe=True, progress=shown)["probe"]
    except ProbeRunError as err:
        raise ABFailed(str(err)) from None
    warnings = []
    if not probe["reproduced"]["all_identical"]:
        warnings.append("the probed run did not reproduce the quantized arm's videos exactly; the probe measured "
                        "the attention it installed, which is not what made the arm")
    if probe.get("peaky_layers"):
        names = ", ".join(f"{p['layer']} (score std {p['score_std']:.0f}, cosine {p['cos_worst']:.4f})"
                          for p in probe["peaky_layers"])
        count = len(probe["peaky_layers"])
        warnings.append(f"attention too peaky for INT8 in {count} layer(s): {names}; {probe['peaky_advice']}")
    for line in warnings:
        notes.append(line)
        echo(f"sagevideo ab: WARNING: {line}")
    return probe


def remove_empty(made: list[Path]) -> None:
    """The folders planning made, left empty: a refused run leaves nothing."""
    for folder in reversed(made):
        if folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()
