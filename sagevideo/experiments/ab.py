"""`sagevideo ab`: paired full-precision vs quantized runs of one job file, then their evaluation.

Three runs through `plan_batch` and `run_batch` (as `sagevideo.generate`), each into its own
folder under `out`, with the same prompts, seeds and sizes (generate draws the initial noise
from a CPU generator seeded by the job's seed, so the arms start from the same latents):
  out/quantized/    attention="sage" (with --plan / --pv), the test arm (run first: its
                    settings are the ones most likely to be refused, before anything else ran)
  out/full/         attention="full", the reference arm
  out/full-repeat/  attention="full" again: the noise floor (full precision vs full precision)
then `sagevideo.eval.evaluate.evaluate(out/full, out/quantized, noise_ref=out/full-repeat)`
writes out/metrics.json and out/report.html. Re-running resumes: finished videos are kept.
Before the first arm runs, every arm folder is locked for the whole run, checked for another
run's videos and marked as ab's (`sagevideo.experiments.ab_folders`; `generate` refuses marked
folders), so a locked or foreign arm is refused at once, not after the arms before it rendered.

The job file decides prompts, seeds, sizes, steps and, for image-to-video models, the input
images (each job's `image:`, or `image` for all): every arm plans the same files, the videos pair
by (prompt, seed, image content) and metrics.json lists the images. It must not set attention,
pv or plan (ab sets them per arm); its `recipe:` section, if any, is the quantized arm's recipe
(layered under the recipe options as `generate` does; the full-precision arms run plain).
With a plan, the quantized arm's recorded attention calls are compared with what the plan implies
(`plan_check`): `generate` installs each job's plan, so a mismatch means the arm did not run the
plan, and ab stops (`ABFailed`) rather than evaluate it as if it had. With `attention_probe` the
quantized jobs are re-run with a probing router (`sagevideo.experiments.probe.rerun_arm`, through
the same generation path), which also checks that the arm is reproduced exactly; with `--sparse` (or
a sparse plan) it re-runs the sparse plan, so each layer's error includes what sparsity costs.
When the quantized arm ran block-sparse layers, metrics.json's `sparse` and the report give per
layer the density reached and the quality cost (`sagevideo.eval.results.sparse_layers`).

With `arms` (`--arm NAME=SETTINGS`, repeatable) the quantized arm is replaced by recipe arms,
each evaluated against full precision: `sagevideo.experiments.ab_arms` (docs/recipe.md); a job
file with a `recipe:` section is then refused (each arm gives its own recipe).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import ConfigDict, Field, ValidationError

from sagevideo.choices import Backend, PVChoice
from sagevideo.errors import ABFailed, InputError
from sagevideo.experiments.ab_arms import ARMS_HELP
from sagevideo.experiments.ab_folders import claim_arm_folders
from sagevideo.jobs.config import RunOptions
from sagevideo.jobs.recipe import RECIPE_FIELDS, RecipeOptions
from sagevideo.jobs.sparse import SparseOptions, is_sparse
from sagevideo.outputs.manifest import ManifestRecord

log = logging.getLogger("sagevideo")

ARMS = {"test": "quantized", "ref": "full", "noise": "full-repeat"}
LABELS = {"ref": "full precision", "test": "quantized", "noise": "full precision, repeated (noise floor)"}
_ARM_FIELDS = ("attention", "pv", "plan", "sparse")


class ABConfig(RunOptions, RecipeOptions, SparseOptions):
    """What `sagevideo ab` runs: the job file's prompts in three arms (see the module docstring),
    with the shared `RunOptions` (model, image: the same in every arm, device, progress); the recipe
    options (`RecipeOptions`) and the block-sparse setting (`SparseOptions`) are the quantized arm's;
    the evaluation's options are `sagevideo.experiments.evaluation.EvalSettings`'s."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    job_file: Path = Field(
        description="Job file (YAML/TOML/text, as for `generate`) without attention, pv, plan or sparse.")
    out: Path = Field(description="Folder for the three arms and the evaluation.")
    plan: Path | None = Field(None, description="Attention-plan JSON for the quantized arm.")
    pv: PVChoice | None = Field(
        None,
        description="P·V precision of the quantized arm (default: the plan's, else auto: FP8 on sm89+ GPUs, "
        "else FP16).",
    )
    backend: Backend = Field("auto", description="sageattn backend of the quantized arm.")
    attention_probe: bool = Field(
        False,
        description="Also measure each layer's attention error (cosine, rel-L1, RMSE vs fp32) by re-running the "
        "quantized jobs with a probing router.",
    )
    noise_floor: bool = Field(True, description="Run full precision twice (the noise floor).")
    arms: list[str] = Field([], description=ARMS_HELP)

    def checked_job_file(self, per_arm: str = "") -> Path:
        """The job file, which exists and sets none of the fields ab sets per arm; InputError
        otherwise (per_arm: what the message adds about the arms)."""
        job_file = self.job_file.expanduser()
        if not job_file.is_file():
            raise InputError(f"JOB_FILE {job_file}: no such file")
        arm_fields = job_file_arm_fields(job_file)
        if arm_fields:
            raise InputError(f"JOB_FILE {job_file} sets {', '.join(arm_fields)}: `sagevideo ab` sets attention, pv, "
                             f"plan and sparse per arm{per_arm}; remove them from the job file")
        return job_file

    def every_arms_settings(self) -> dict[str, Any]:
        """The `plan_batch` keywords every arm shares: model, backend, device, and the image (every
        arm plans the same files, so every arm starts from the same images)."""
        common: dict[str, Any] = {"model": self.model, "backend": self.backend, "device": self.device}
        if self.image is not None:
            common["image"] = self.image
        return common

    def options_beside_arms(self) -> list[str]:
        """The options given beside `arms` that each arm gives itself (--plan, --pv, the recipe's,
        --attention-probe), as flags."""
        given = [f"--{name.replace('_', '-')}" for name in ("plan", "pv", "sparse", *RECIPE_FIELDS)
                 if getattr(self, name) != ABConfig.model_fields[name].default]
        return given + (["--attention-probe"] if self.attention_probe else [])

    @classmethod
    def build(cls, job_file: Any = None, /, **fields: Any) -> ABConfig:
        """An ABConfig from one (with `fields` over it) or from the job file and fields; InputError
        naming each bad option."""
        from sagevideo.jobs.problems import options_error

        data = {**dict(job_file), **fields} if isinstance(job_file, ABConfig) else {"job_file": job_file, **fields}
        try:
            return cls(**data)
        except ValidationError as err:
            raise options_error(err) from None


def job_file_arm_fields(job_file: Path) -> list[str]:
    """Where a YAML/TOML job file sets attention, pv, plan or sparse (ab sets those per arm), read by the job
    files' own parsers (TOML through tomllib or, on Python 3.10, tomli)."""
    from sagevideo.jobs.files import fields_set_in

    return fields_set_in(job_file, _ARM_FIELDS)


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


def ab(
    config: ABConfig | str | Path | None = None,
    /,
    *,
    options: Any = None,
    echo: Callable[[str], None] = print,
    **fields: Any,
) -> dict[str, Any]:
    """Run the arms and evaluate them; returns the metrics.json content.

    config: an `ABConfig`, or the job file of one whose other fields are keyword arguments (see
    `ABConfig` for each field). With `arms` (recipe arms, see `_ab_arms`) the result is the arms
    summary, schema "sagevideo.ab.arms". The recipe fields are the quantized arm's `Recipe`, so the
    report says what quantized attention with that recipe costs against full precision; a job
    file's `recipe:` section is the quantized arm's too, where these are left at their defaults
    (with `arms` it is refused: each arm gives its own).
    options: `sagevideo.eval.evaluate.EvalOptions` (metrics, weights, bootstrap...). Raises
    InputError (or EvalInputError) before running anything for bad input; ABFailed when a job
    failed or the quantized arm's attention calls do not match the plan; ModelLoadError (from
    generate) when the model cannot be loaded.
    """
    from sagevideo.eval.evaluate import evaluate, prepare_out
    from sagevideo.experiments.probe import ProbeRunError, rerun_arm
    from sagevideo.generation.generate import plan_batch, run_batch

    config = ABConfig.build(config, **fields)
    if config.arms:
        return _ab_arms(config, options=options, echo=echo)
    out, model, plan, progress = config.out, config.model, config.plan, config.progress
    attention_probe, noise_floor = config.attention_probe, config.noise_floor
    job_file = config.checked_job_file(" (full precision vs --plan/--pv)")
    loaded_plan, quantized = _quantized_arm(config)
    options = checked_options(options)
    shown = (lambda text: echo(f"sagevideo ab: {text}")) if progress else None  # re-runs' and evaluation's steps
    options.labels = dict(LABELS)

    common = config.every_arms_settings()
    runs = [("test", quantized), ("ref", {"attention": "full"})]
    if noise_floor:
        runs.append(("noise", {"attention": "full"}))
    # Every arm is planned (and so checked) before anything runs or any folder is made for it.
    if Path(out).expanduser().exists():
        prepare_out(out)  # an --out that is a file is said as such, not as a bad arm folder
    # The job file's recipe: section is the quantized arm's (under the options); the full-precision arms run plain.
    batches = {role: plan_batch(job_file, out=Path(out).expanduser() / ARMS[role], use_file_recipe=role == "test",
                                ab_arm=True, **common, **settings)
               for role, settings in runs}
    recipe = batches["test"].settings.recipe
    out_dir = prepare_out(out)
    records: dict[str, list[ManifestRecord]] = {}
    with claim_arm_folders(out_dir, batches.values(), echo) as arms:  # every arm locked and checked first
        for role, batch in batches.items():
            echo(f"sagevideo ab: {LABELS[role]} arm -> {out_dir / ARMS[role]}")
            for note in batch.notes:
                if note.startswith("plan "):  # e.g. a plan calibrated for another step count
                    echo(f"sagevideo ab: {note}")
            recs = run_batch(batch, progress=progress, lock=arms.lock(batch.out)).records
            failed = [r for r in recs if not r.done]
            if failed:
                raise ABFailed(
                    f"{len(failed)} job(s) of the {LABELS[role]} arm failed (first: {failed[0].error}); see "
                    f"{out_dir / ARMS[role] / 'manifest.jsonl'}; re-running the same command resumes"
                )
            records[role] = recs

    notes = []
    check = None
    test_dir = out_dir / ARMS["test"]
    probe = None
    if loaded_plan is not None:
        check = plan_check(loaded_plan, records["test"])
        notes.append(f"plan check ({ARMS['test']}/): {check['message']}")
        if not check["consistent"]:
            raise ABFailed(f"{check['message']}; see {test_dir / 'manifest.jsonl'}")
    if attention_probe:
        echo("sagevideo ab: attention probe: re-running the quantized jobs with a probing router")
        try:
            probe = rerun_arm(
                records["test"], arm_dir=test_dir, plan=loaded_plan, model=model, probe=True, progress=shown
            )["probe"]
        except ProbeRunError as err:
            raise ABFailed(str(err)) from None
        if not probe["reproduced"]["all_identical"]:
            line = (
                "the probed run did not reproduce the quantized arm's videos exactly; the probe measured the "
                "attention it installed, which is not what made the arm"
            )
            notes.append(line)
            echo(f"sagevideo ab: WARNING: {line}")
    if probe is not None and probe.get("peaky_layers"):
        names = ", ".join(f"{p['layer']} (score std {p['score_std']:.0f}, cosine {p['cos_worst']:.4f})"
                          for p in probe["peaky_layers"])
        count = len(probe["peaky_layers"])
        line = f"attention too peaky for INT8 in {count} layer(s): {names}; {probe['peaky_advice']}"
        notes.append(line)
        echo(f"sagevideo ab: WARNING: {line}")
    if not noise_floor:
        notes.append("no noise-floor run (--no-noise-floor): verdicts cannot say whether a difference is noise")
    first = records["test"][0]
    run_info = {
        "command": "sagevideo ab",
        "job_file": str(job_file),
        "model": model,
        "model_fingerprint": first.model_fingerprint,
        "plan": str(plan) if plan is not None else None,
        "plan_sha256": first.plan_sha256,
        "pv": first.pv,
        "backend": first.backend,
        "device": first.device,
        "dtype": first.dtype,
        "plan_check": check["message"] if check else None,
        "images": {r.image_sha256: r.image for r in records["test"] if r.image_sha256} or None,
        "quantized_arm": str(test_dir.relative_to(out_dir)),
        "attention_probe": attention_probe,
        "recipe": recipe.label(),
        "sparse": config.sparse if is_sparse(config.sparse) else None,
    }
    return evaluate(
        out_dir / ARMS["ref"],
        test_dir,
        out=out_dir,
        noise_ref=out_dir / ARMS["noise"] if noise_floor else None,
        options=options,
        records=records,
        attention_probe=probe,
        run_info=run_info,
        notes=notes,
        echo=echo,
        progress=shown,
    )


def _quantized_arm(config: ABConfig) -> tuple[Any, dict[str, Any]]:
    """(the loaded --plan or None, the quantized arm's `plan_batch` keywords: sage attention, the
    recipe, --pv (default: the plan's default mode), the plan); InputError for a plan that does not load."""
    from sagevideo.pipelines.plans import AttentionPlan, PlanError

    settings: dict[str, Any] = {"attention": "sage", **config.recipe.model_dump()}
    if is_sparse(config.sparse):
        settings["sparse"] = config.sparse
    pv, loaded_plan = config.pv, None
    if config.plan is not None:
        try:
            loaded_plan = AttentionPlan.load(config.plan)
        except (PlanError, OSError) as err:
            raise InputError(f"--plan {config.plan}: {err}") from None
        settings["plan"] = str(Path(config.plan).expanduser().resolve())
        if pv is None:
            pv = loaded_plan.default.mode.pv  # None when the default is full precision
    if pv is not None:
        settings["pv"] = pv
    return loaded_plan, settings


def checked_options(options: Any) -> Any:
    """The evaluation's options (`EvalOptions`; None: the defaults), their metrics checked before anything runs."""
    from sagevideo.eval.evaluate import EvalOptions, check_metrics

    options = options or EvalOptions()
    check_metrics(options.metrics)
    return options


def _ab_arms(config: ABConfig, *, options: Any, echo: Callable[[str], None]) -> dict[str, Any]:
    """`ab` with `--arm`s: full precision (twice), then each recipe arm, each evaluated against it
    (`sagevideo.experiments.ab_arms`); returns the summary written to out/metrics.json."""
    import json

    from sagevideo.eval.evaluate import evaluate, prepare_out
    from sagevideo.eval.results import versions
    from sagevideo.eval.stats import json_safe
    from sagevideo.experiments.ab_arms import (
        ARMS_SCHEMA,
        ARMS_SCHEMA_VERSION,
        arm_summary,
        denoise_seconds,
        parse_arms,
        render_arms,
    )
    from sagevideo.generation.generate import plan_batch, run_batch
    from sagevideo.jobs.files import load_job_file

    flat = config.options_beside_arms()
    if flat:
        raise InputError(f"{', '.join(flat)}: with --arm each arm gives its own settings (e.g. "
                         "--arm sage-fp8=attention=sage,linear=fp8); leave these out")
    arms = parse_arms(list(config.arms))
    job_file = config.checked_job_file()
    file_recipe = load_job_file(job_file).recipe
    if file_recipe is not None:  # merged into every arm, it would make arms differ from what their names say
        raise InputError(f"{file_recipe.at()}: with --arm each arm gives its own recipe; remove the job file's "
                         "recipe: section, or run without --arm to give it to the quantized arm")
    options = checked_options(options)
    progress = config.progress
    shown = (lambda text: echo(f"sagevideo ab: {text}")) if progress else None
    common = config.every_arms_settings()
    out = Path(config.out).expanduser()
    if out.exists():
        prepare_out(out)
    runs: list[tuple[str, str, Path, dict[str, Any]]] = [  # (key, label, folder, settings); arms first
        *((f"arm:{a.name}", f"{a.name} ({a.label()})", out / "arms" / a.name, a.generate_settings()) for a in arms),
        ("ref", LABELS["ref"], out / ARMS["ref"], {"attention": "full"}),
    ]
    if config.noise_floor:
        runs.append(("noise", LABELS["noise"], out / ARMS["noise"], {"attention": "full"}))
    # Every arm is planned (settings, recipe on this machine: fp8 on CPU...) before anything runs.
    problems, batches = [], {}
    made = [p for p in (out, out / "arms", *(folder for _, _, folder, _ in runs)) if not p.exists()]
    for key, label, folder, settings in runs:
        try:
            batches[key] = plan_batch(job_file, out=folder, ab_arm=True, **common, **settings)
        except InputError as err:
            problems.append(f"arm {label}: {err}" if key.startswith("arm:") else str(err))
    if problems:
        _remove_empty(made)
        raise InputError("; ".join(problems))
    out_dir = prepare_out(out)
    records: dict[str, list[ManifestRecord]] = {}
    try:
        claimed = claim_arm_folders(out_dir, batches.values(), echo)  # every arm locked and checked first
    except InputError:
        _remove_empty(made)
        raise
    with claimed as arm_folders:
        for key, label, folder, _ in runs:
            echo(f"sagevideo ab: {label} arm -> {folder}")
            recs = run_batch(batches[key], progress=progress, lock=arm_folders.lock(batches[key].out)).records
            failed = [r for r in recs if not r.done]
            if failed:
                raise ABFailed(f"{len(failed)} job(s) of the {label} arm failed (first: {failed[0].error}); see "
                               f"{folder / 'manifest.jsonl'}; re-running the same command resumes")
            records[key] = recs
    notes = [] if config.noise_floor else [
        "no noise-floor run (--no-noise-floor): verdicts cannot say whether a difference is noise"]
    first = records["ref"][0]
    run_info = {"command": "sagevideo ab", "job_file": str(job_file), "model": config.model,
                "model_fingerprint": first.model_fingerprint, "backend": config.backend, "device": first.device,
                "dtype": first.dtype, "arms": [a.name for a in arms]}
    summaries = []
    for arm in arms:
        echo(f"sagevideo ab: evaluating {arm.name} against full precision")
        eval_dir = out_dir / "evals" / arm.name
        arm_options = copy_options(options, test_label=f"{arm.name} ({arm.label()})")
        arm_records = {"ref": records["ref"], "test": records[f"arm:{arm.name}"]}
        if config.noise_floor:
            arm_records["noise"] = records["noise"]
        result = evaluate(
            out_dir / ARMS["ref"], out_dir / "arms" / arm.name, out=eval_dir,
            noise_ref=out_dir / ARMS["noise"] if config.noise_floor else None, options=arm_options,
            records=arm_records, run_info={**run_info, "arm": arm.name, "arm_settings": arm.text,
                                           "recipe": arm.recipe.label()},
            notes=notes, echo=echo, progress=shown,
        )
        summaries.append(arm_summary(arm, records[f"arm:{arm.name}"], records["ref"], result, eval_dir, out_dir))
    summary: dict[str, Any] = {
        "schema": ARMS_SCHEMA,
        "schema_version": ARMS_SCHEMA_VERSION,
        "run": run_info,
        "reference": {"folder": ARMS["ref"], "noise_floor": ARMS["noise"] if config.noise_floor else None,
                      "denoise_s": denoise_seconds(records["ref"])},
        "n_pairs": len(records["ref"]),
        "arms": summaries,
        "verdicts": [line for s in summaries for line in s["verdicts"]],
        "failed": {f"{s['name']}: {k}": v for s in summaries for k, v in s["failed"].items()},
        "notes": notes,
        "versions": versions(),
    }
    (out_dir / "metrics.json").write_text(
        json.dumps(json_safe(summary), indent=2, ensure_ascii=False, allow_nan=False) + "\n", encoding="utf-8"
    )
    (out_dir / "report.html").write_text(render_arms(summary), encoding="utf-8")
    return summary



def _remove_empty(made: list[Path]) -> None:
    """The folders planning made, left empty: a refused run leaves nothing."""
    for folder in reversed(made):
        if folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()


def copy_options(options: Any, *, test_label: str) -> Any:
    """A copy of EvalOptions with the arms' labels (the test arm named as given)."""
    import dataclasses

    return dataclasses.replace(options, labels={**LABELS, "test": test_label})
