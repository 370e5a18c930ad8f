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
the same generation path), which also checks that the arm is reproduced exactly.

With `arms` (`--arm NAME=SETTINGS`, repeatable) the quantized arm is replaced by recipe arms,
each evaluated against full precision: `sagevideo.experiments.ab_arms` (docs/recipe.md); a job
file with a `recipe:` section is then refused (each arm gives its own recipe).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import ConfigDict, Field, ValidationError

from sagevideo.choices import Backend, Device, PVChoice
from sagevideo.errors import ABFailed, InputError  # noqa: F401 - ABFailed (raised by ab_runs) importable from here, as before
from sagevideo.experiments.ab_arms import ARMS_HELP
from sagevideo.experiments.ab_folders import claim_arm_folders
from sagevideo.experiments.ab_runs import (
    arm_settings,
    checked_job_file,
    checked_plan,
    probed,
    remove_empty,
    run_arms,
)
from sagevideo.jobs.recipe import RECIPE_FIELDS, RecipeOptions
from sagevideo.outputs.manifest import ManifestRecord

log = logging.getLogger("sagevideo")

ARMS = {"test": "quantized", "ref": "full", "noise": "full-repeat"}
LABELS = {"ref": "full precision", "test": "quantized", "noise": "full precision, repeated (noise floor)"}
NO_NOISE_FLOOR = "no noise-floor run (--no-noise-floor): verdicts cannot say whether a difference is noise"


class ABConfig(RecipeOptions):
    """What `sagevideo ab` runs: the job file's prompts in three arms (see the module docstring);
    the recipe options (`RecipeOptions`) are the quantized arm's; the evaluation's options are
    `sagevideo.eval.evaluate.EvalOptions`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    job_file: Path = Field(description="Job file (YAML/TOML/text, as for `generate`) without attention, pv or plan.")
    out: Path = Field(description="Folder for the three arms and the evaluation.")
    model: str = Field("tiny", description="'tiny' (built in) or a local diffusers folder.")
    plan: Path | None = Field(None, description="Attention-plan JSON for the quantized arm.")
    image: Path | None = Field(
        None, description="Input image (image-to-video models) for the jobs that name none; the same in every arm."
    )
    pv: PVChoice | None = Field(
        None,
        description="P·V precision of the quantized arm (default: the plan's, else auto: FP8 on sm89+ GPUs, "
        "else FP16).",
    )
    backend: Backend = Field("auto", description="sageattn backend of the quantized arm.")
    device: Device = Field("auto", description="auto = CUDA when available, else CPU.")
    attention_probe: bool = Field(
        False,
        description="Also measure each layer's attention error (cosine, rel-L1, RMSE vs fp32) by re-running the "
        "quantized jobs with a probing router.",
    )
    noise_floor: bool = Field(True, description="Run full precision twice (the noise floor).")
    arms: list[str] = Field([], description=ARMS_HELP)
    progress: bool = Field(True, description="Show progress bars.")

    @classmethod
    def build(cls, job_file: Any = None, /, **fields: Any) -> ABConfig:
        """An ABConfig from one (with `fields` over it) or from the job file and fields; InputError
        naming each bad option."""
        from sagevideo.jobs.problems import group_problems, value_problems

        data = {**dict(job_file), **fields} if isinstance(job_file, ABConfig) else {"job_file": job_file, **fields}
        try:
            return cls(**data)
        except ValidationError as err:
            raise InputError(group_problems([(place, text) for _, place, text in value_problems(err)])) from None


def ab(
    config: ABConfig | str | Path | None = None,
    /,
    *,
    options: Any = None,
    echo: Callable[[str], None] = print,
    **fields: Any,
) -> dict[str, Any]:
    """Run the arms and evaluate them; returns the metrics.json content.

    config: an `ABConfig`, or the job file of one whose other fields are keyword arguments (out,
    model, plan, image, pv, backend, device, attention_probe, noise_floor, progress, arms (recipe
    arms, see `_ab_arms`: then the result is the arms summary, schema "sagevideo.ab.arms"); compile,
    compile_backend, linear, linear_keep, cache, cache_threshold: the quantized arm's `Recipe`,
    so the report says what quantized attention with that recipe costs against full precision;
    a job file's `recipe:` section is the quantized arm's too, where these are left at their
    defaults (with `arms` it is refused: each arm gives its own).
    options: `sagevideo.eval.evaluate.EvalOptions` (metrics, weights, bootstrap...). Raises
    InputError (or EvalInputError) before running anything for bad input; ABFailed when a job
    failed or the quantized arm's attention calls do not match the plan; ModelLoadError (from
    generate) when the model cannot be loaded.
    """
    from sagevideo.eval.evaluate import EvalOptions, check_metrics, evaluate, prepare_out
    from sagevideo.generation.generate import plan_batch
    from sagevideo.pipelines.plans import AttentionPlan, PlanError

    config = ABConfig.build(config, **fields)
    if config.arms:
        return _ab_arms(config, options=options, echo=echo)
    out, model, plan, pv, progress = config.out, config.model, config.plan, config.pv, config.progress
    attention_probe, noise_floor = config.attention_probe, config.noise_floor
    job_file = checked_job_file(config.job_file, "`sagevideo ab` sets attention, pv and plan per arm (full "
                                                 "precision vs --plan/--pv)")
    loaded_plan = None
    if plan is not None:
        try:
            loaded_plan = AttentionPlan.load(plan)
        except (PlanError, OSError) as err:
            raise InputError(f"--plan {plan}: {err}") from None
        if pv is None:
            pv = loaded_plan.default.mode.pv  # None when the default is full precision
    options = options or EvalOptions()
    check_metrics(options.metrics)
    shown = (lambda text: echo(f"sagevideo ab: {text}")) if progress else None  # re-runs' and evaluation's steps
    options.labels = dict(LABELS)

    quantized: dict[str, Any] = {"attention": "sage", **config.recipe.model_dump()}  # the quantized arm's recipe
    if pv is not None:
        quantized["pv"] = pv
    if plan is not None:
        quantized["plan"] = str(Path(plan).expanduser().resolve())
    runs = [("test", quantized), ("ref", {"attention": "full"})]
    if noise_floor:
        runs.append(("noise", {"attention": "full"}))
    # Every arm is planned (and so checked) before anything runs or any folder is made for it.
    if Path(out).expanduser().exists():
        prepare_out(out)  # an --out that is a file is said as such, not as a bad arm folder
    # The job file's recipe: section is the quantized arm's (under the options); the full-precision arms run plain.
    batches = {role: plan_batch(job_file, out=Path(out).expanduser() / ARMS[role], use_file_recipe=role == "test",
                                ab_arm=True, **arm_settings(config), **settings)
               for role, settings in runs}
    recipe = batches["test"].settings.recipe
    out_dir = prepare_out(out)
    with claim_arm_folders(out_dir, batches.values(), echo) as arms:  # every arm locked and checked first
        records = run_arms([(role, LABELS[role], out_dir / ARMS[role], batch) for role, batch in batches.items()],
                           arms, progress=progress, echo=echo)

    notes: list[str] = []
    test_dir = out_dir / ARMS["test"]
    check = checked_plan(loaded_plan, records["test"], test_dir, notes) if loaded_plan is not None else None
    probe = probed(records["test"], test_dir, loaded_plan, model, notes, echo, shown) if attention_probe else None
    if not noise_floor:
        notes.append(NO_NOISE_FLOOR)
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


def _ab_arms(config: ABConfig, *, options: Any, echo: Callable[[str], None]) -> dict[str, Any]:
    """`ab` with `--arm`s: full precision (twice), then each recipe arm, each evaluated against it
    (`sagevideo.experiments.ab_arms`); returns the summary written to out/metrics.json."""
    from sagevideo.eval.evaluate import EvalOptions, check_metrics, prepare_out
    from sagevideo.experiments.ab_arms import parse_arms
    from sagevideo.jobs.files import load_job_file

    flat = [f"--{name.replace('_', '-')}" for name in ("plan", "pv", *RECIPE_FIELDS)
            if getattr(config, name) != ABConfig.model_fields[name].default]
    if config.attention_probe:
        flat.append("--attention-probe")
    if flat:
        raise InputError(f"{', '.join(flat)}: with --arm each arm gives its own settings (e.g. "
                         "--arm sage-fp8=attention=sage,linear=fp8); leave these out")
    arms = parse_arms(list(config.arms))
    job_file = checked_job_file(config.job_file, "`sagevideo ab` sets attention, pv and plan per arm")
    file_recipe = load_job_file(job_file).recipe
    if file_recipe is not None:  # merged into every arm, it would make arms differ from what their names say
        raise InputError(f"{file_recipe.at()}: with --arm each arm gives its own recipe; remove the job file's "
                         "recipe: section, or run without --arm to give it to the quantized arm")
    options = options or EvalOptions()
    check_metrics(options.metrics)
    out = Path(config.out).expanduser()
    if out.exists():
        prepare_out(out)
    runs: list[tuple[str, str, Path, dict[str, Any]]] = [  # (key, label, folder, settings); arms first
        *((f"arm:{a.name}", f"{a.name} ({a.label()})", out / "arms" / a.name, a.generate_settings()) for a in arms),
        ("ref", LABELS["ref"], out / ARMS["ref"], {"attention": "full"}),
    ]
    if config.noise_floor:
        runs.append(("noise", LABELS["noise"], out / ARMS["noise"], {"attention": "full"}))
    made = [p for p in (out, out / "arms", *(folder for _, _, folder, _ in runs)) if not p.exists()]
    batches = _planned_arms(job_file, runs, arm_settings(config), made)
    out_dir = prepare_out(out)
    try:
        claimed = claim_arm_folders(out_dir, batches.values(), echo)  # every arm locked and checked first
    except InputError:
        remove_empty(made)
        raise
    with claimed as arm_folders:
        records = run_arms([(key, label, folder, batches[key]) for key, label, folder, _ in runs], arm_folders,
                           progress=config.progress, echo=echo)
    first = records["ref"][0]
    run_info = {"command": "sagevideo ab", "job_file": str(job_file), "model": config.model,
                "model_fingerprint": first.model_fingerprint, "backend": config.backend, "device": first.device,
                "dtype": first.dtype, "arms": [a.name for a in arms]}
    return _evaluate_arms(arms, records, out_dir, run_info, options, noise_floor=config.noise_floor,
                          progress=config.progress, echo=echo)


def _planned_arms(job_file: Path, runs: list[tuple[str, str, Path, dict[str, Any]]], common: dict[str, Any],
                  made: list[Path]) -> dict[str, Any]:
    """Every arm's batch, planned (settings, recipe on this machine: fp8 on CPU...) before anything
    runs: {key: BatchPlan}; one InputError naming each arm's problems, with the folders planning
    made (`made`) removed."""
    from sagevideo.generation.generate import plan_batch

    problems, batches = [], {}
    for key, label, folder, settings in runs:
        try:
            batches[key] = plan_batch(job_file, out=folder, ab_arm=True, **common, **settings)
        except InputError as err:
            problems.append(f"arm {label}: {err}" if key.startswith("arm:") else str(err))
    if problems:
        remove_empty(made)
        raise InputError("; ".join(problems))
    return batches


def _evaluate_arms(arms: list[Any], records: dict[str, list[ManifestRecord]], out_dir: Path, run_info: dict[str, Any],
                   options: Any, *, noise_floor: bool, progress: bool, echo: Callable[[str], None]) -> dict[str, Any]:
    """Each recipe arm evaluated against full precision (out/evals/NAME), then the arms' summary
    written to out/metrics.json and out/report.html; returns the summary."""
    import json

    from sagevideo.eval.evaluate import evaluate
    from sagevideo.eval.results import versions
    from sagevideo.eval.stats import json_safe
    from sagevideo.experiments.ab_arms import (
        ARMS_SCHEMA,
        ARMS_SCHEMA_VERSION,
        arm_summary,
        denoise_seconds,
        render_arms,
    )

    shown = (lambda text: echo(f"sagevideo ab: {text}")) if progress else None
    notes = [] if noise_floor else [NO_NOISE_FLOOR]
    summaries = []
    for arm in arms:
        echo(f"sagevideo ab: evaluating {arm.name} against full precision")
        eval_dir = out_dir / "evals" / arm.name
        arm_options = copy_options(options, test_label=f"{arm.name} ({arm.label()})")
        arm_records = {"ref": records["ref"], "test": records[f"arm:{arm.name}"]}
        if noise_floor:
            arm_records["noise"] = records["noise"]
        result = evaluate(
            out_dir / ARMS["ref"], out_dir / "arms" / arm.name, out=eval_dir,
            noise_ref=out_dir / ARMS["noise"] if noise_floor else None, options=arm_options,
            records=arm_records, run_info={**run_info, "arm": arm.name, "arm_settings": arm.text,
                                           "recipe": arm.recipe.label()},
            notes=notes, echo=echo, progress=shown,
        )
        summaries.append(arm_summary(arm, records[f"arm:{arm.name}"], records["ref"], result, eval_dir, out_dir))
    summary: dict[str, Any] = {
        "schema": ARMS_SCHEMA,
        "schema_version": ARMS_SCHEMA_VERSION,
        "run": run_info,
        "reference": {"folder": ARMS["ref"], "noise_floor": ARMS["noise"] if noise_floor else None,
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


def copy_options(options: Any, *, test_label: str) -> Any:
    """A copy of EvalOptions with the arms' labels (the test arm named as given)."""
    import dataclasses

    return dataclasses.replace(options, labels={**LABELS, "test": test_label})
