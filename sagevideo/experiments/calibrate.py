"""`sagevideo.calibrate(...)`: load a model, run prompts with probing attention, write a plan.

The model and its job constraints come from its family (`sagevideo.pipelines.families`, through
`resolve_model`); the prompts run through the one generation path (`PipelineHost.generate`,
denoising only) with the probing router as the host's attention hook.
`CalibrateConfig` declares every option once (the CLI's `sagevideo calibrate` options are made from
it, the Python API validates its keyword arguments with it).

The recipe options say under which recipe attention is measured: `--linear fp8` (and
`--linear-keep`) are applied before capture, since FP8 linears change the Q/K/V that attention
sees; `--compile` is accepted and not applied (compiling does not change what attention sees, and
the probe measures in Python), a note in the plan says so; `--cache` is refused (a step cache
skips the forwards whose attention is measured). The plan's `recipe` records the settings.

`--sparse METHOD:DENSITY` is measured (docs/sparse.md, stage 4b): at the captured steps from
ceil(steps/5) on, each layer's tiles are selected at DENSITY, 2x and 4x DENSITY, and the sparse output
of each mode compared with the same mode's dense output; per layer, on the mode calibration chose,
the sparsest density whose worst cosine meets `--sparse-budget` (default 0.99) is written into the
plan from step ceil(steps/5) on; over-budget layers, full-precision ones and each denoiser's first
sparse layer stay dense (`pipelines.calibrate.choose_sparse`); `sagevideo ab --plan` judges the plan.
With dynamic selection the prompts run twice: the first pass finds each layer's top_p per density on
the captured calls, the second measures the layers with those top_p's, and the plan gets them
(`Sparse.top_p`: the rule its calls run, sync-free; `pipelines.calibrate`'s docstring)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from pydantic import BeforeValidator, ConfigDict, Field, ValidationError

from sagevideo.choices import resolve_device
from sagevideo.errors import InputError
from sagevideo.jobs.config import RunOptions
from sagevideo.jobs.problems import group_problems, option_place, options_error
from sagevideo.jobs.recipe import RecipeOptions
from sagevideo.jobs.sparse import SparseBudgetOptions, SparseOptions, is_sparse
from sagevideo.jobs.specs import DEFAULT_PROMPTS, Frames, Guidance, Pixels, Seed, Steps, collect_jobs
from sagevideo.jobs.text_files import read_prompts_file


def _step_list(value: Any) -> Any:
    """'0,1,-1' (the command line's spelling) -> [0, 1, -1]."""
    if isinstance(value, str):
        try:
            return [int(s) for s in value.split(",") if s.strip()]
        except ValueError:
            raise ValueError("give integers like 0,1,-1") from None
    return value


def _cosine(value: Any) -> Any:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and not 0 < value <= 1:
        raise ValueError("not a cosine in (0, 1]; the default is 0.999")
    return value


class CalibrateConfig(RunOptions, RecipeOptions, SparseOptions, SparseBudgetOptions):
    """Every option of a calibration, in the CLI's order (then the shared `RunOptions`: model, image
    (every prompt starts from it), device, progress); the recipe options (`RecipeOptions`) say under
    which recipe attention is measured (see `calibrate`); `--sparse` (`SparseOptions`) and its budget
    (`SparseBudgetOptions`) give the densities measured per layer and the error they may cost."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    prompts_file: Path | None = Field(None, description="Text file with one prompt per line.")
    out: Path = Field(description="Where to write the plan (JSON).")
    prompts: list[str] | None = Field(None, description="A prompt (repeatable).")
    steps: Steps | None = Field(None, description="Denoising steps (default: the model's).")
    capture_steps: Annotated[list[int] | None, BeforeValidator(_step_list)] = Field(
        None, description="Steps to measure, e.g. '0,1,-1' (default: all)."
    )
    threshold: Annotated[float, BeforeValidator(_cosine)] = Field(
        0.999, description="Worst cosine a quantized mode must reach per layer."
    )
    frames: Frames | None = Field(None, description="Frames (default: the model's).")
    height: Pixels | None = Field(None, description="Height in px (default: the model's).")
    width: Pixels | None = Field(None, description="Width in px (default: the model's).")
    guidance: Guidance | None = Field(
        None, description="Classifier-free guidance scale (<= 1 disables it; default: the model's)."
    )
    seed: Seed = Field(0, description="Seed of the initial noise.")
    save_qkv: Path | None = Field(
        None, description="Also save captured Q/K/V (safetensors) for `sagevideo simulate --qkv`."
    )

    @classmethod
    def build(cls, prompts: Any = None, /, **options: Any) -> CalibrateConfig:
        """A config from one (with `options` over it) or from prompts and keyword options;
        InputError naming every bad option at once."""
        if isinstance(prompts, CalibrateConfig):
            data = {**dict(prompts), **options}
        else:
            data = dict(options)
            if prompts is not None:
                data["prompts"] = list(prompts)
        try:
            return cls(**data)
        except ValidationError as err:
            raise options_error(err) from None


def calibrate(config: CalibrateConfig | list[str] | None = None, /, **options: Any) -> Any:
    """Calibrate attention per layer on prompts and save the chosen plan to `out` (JSON).

    config: a `CalibrateConfig`, or the prompts of one whose other fields are keyword arguments
    (see `CalibrateConfig` for each field; without prompts nor a prompts file: the built-in pair).
    The recipe fields say under which recipe attention is measured (see the module docstring:
    linear applies, compile is noted and not applied, cache is refused); recorded in the plan's `recipe`.
    Returns a `CalibrationResult` (errors per layer and mode, the plan, the choices).
    Raises InputError before loading anything when an input is invalid.
    """
    from sagevideo.outputs.files import writable_file
    from sagevideo.pipelines.batch_check import check_images
    from sagevideo.pipelines.loading import resolve_model

    config = CalibrateConfig.build(config, **options)
    given = config.prompts is not None or config.prompts_file is not None
    prompts = list(config.prompts or [])
    if config.prompts_file is not None:  # UTF-8 text with at least one prompt, else one line saying so
        prompts += [text for text, _ in read_prompts_file(config.prompts_file)]
    options = {k: getattr(config, k) for k in ("seed", "frames", "height", "width", "steps", "guidance")}
    if config.image is not None:
        options["image"] = str(Path(config.image).expanduser().resolve())
    # Both files are written after the whole calibration: a path that cannot take them fails now.
    out = writable_file(config.out, "--out", InputError)
    save_qkv = config.save_qkv
    if save_qkv is not None:
        save_qkv = writable_file(save_qkv, "--save-qkv", InputError, "qkv.safetensors")
        if save_qkv.resolve() == out.resolve():
            raise InputError(f"--save-qkv {save_qkv}: is the --out file; give the Q/K/V their own file")
    if given and not prompts:
        raise InputError("no prompts to calibrate on; give --prompt or a prompts file with one prompt per line")
    model = config.model
    source = resolve_model(model)
    defaults = {k: v for k, v in options.items() if v is not None}
    parsed, problems = collect_jobs([(p, f"--prompt {p!r}") for p in (prompts or DEFAULT_PROMPTS)], defaults)
    if problems:
        raise InputError(group_problems(problems))
    jobs = [source.resolve(job) for job, _, _ in parsed]
    for problem in source.problems(jobs[0]):  # sizes and frames come from the options (or the model)
        field, text = problem.split(": ", 1)
        problems.append((option_place(field, options[field]) if options.get(field) else f"--model {model}", text))
    image_shas, found, _ = check_images(source, [(jobs[0], f"--model {model}", {})], options)
    problems += found  # every prompt has the same image: the first job says it for all
    device = resolve_device(config.device)
    measured, found = _measured_recipe(config.recipe, source, device)
    problems += found
    if problems:
        raise InputError(group_problems(problems))
    _check_memory(source, jobs, device)
    n_steps = jobs[0].steps
    captured = None
    if config.capture_steps is not None:
        bad = [s for s in config.capture_steps if not -n_steps <= s < n_steps]
        if bad:
            raise InputError(
                f"--capture-steps {bad} are outside the run's {n_steps} steps (0..{n_steps - 1}, or -1 for the last)"
            )
        captured = {s % n_steps for s in config.capture_steps}
    _check_sparse(config, n_steps, captured)
    return _run(source, jobs, out, captured, config.threshold, device, n_steps, save_qkv, config.progress,
                image_shas, measured, recipe_record(config.recipe, measured), config.sparse,
                config.sparse_budget)


def _check_sparse(config: CalibrateConfig, n_steps: int, captured: set[int] | None) -> None:
    """InputError for sparse settings calibration cannot measure: a budget without --sparse, a run with
    no sparse step, or captured steps that are all in the dense first fifth."""
    from sagevideo.pipelines.plans import dense_steps

    if ":reuse" in str(config.sparse) and captured is not None:
        raise InputError(f"--sparse {config.sparse} with --capture-steps: a reusing step needs the step that selected "
                         "its lists measured too; leave --capture-steps out (or :reuseN out of --sparse)")
    if not is_sparse(config.sparse):
        if config.sparse_budget is not None:
            raise InputError(f"--sparse-budget {config.sparse_budget}: only with --sparse METHOD:DENSITY (the "
                             "densities it judges); give both or neither")
        return
    first = dense_steps(n_steps)
    if n_steps <= first:
        raise InputError(f"--sparse {config.sparse} with {n_steps} step(s): the first ceil(steps/5) steps stay dense, "
                         "so no step would be sparse; give --steps 2 or more")
    if captured is not None and max(captured) < first:
        raise InputError(f"--capture-steps {sorted(captured)} with --sparse {config.sparse}: the plan is sparse from "
                         f"step {first} on, so no captured step would measure it; capture a later step too (e.g. -1)")


def _measured_recipe(given: Any, source: Any, device: str) -> tuple[Any, list[tuple[str, str]]]:
    """(the `Recipe` attention is measured under, problems): the FP8 linears of `given` (checked on
    this machine, as `generate` checks them); compile is not applied; a cache is refused."""
    from sagevideo.jobs.recipe import Recipe
    from sagevideo.pipelines.recipe import recipe_problems

    problems = [(option, text) for _, option, text in given.problems()]
    if given.cache != "none":
        problems.append((f"--cache {given.cache}", (
            "calibration measures each layer's attention in every forward, and a step cache skips the forwards "
            "whose attention it would measure; calibrate without --cache (the plan serves cached runs too)")))
    measured = Recipe(linear=given.linear, linear_keep=given.linear_keep)
    dtype = "bfloat16" if device.startswith("cuda") else "float32"
    problems += recipe_problems(measured, source, device, dtype)
    return measured, problems


def recipe_record(given: Any, measured: Any) -> dict[str, Any] | None:
    """The plan's `recipe`: the settings attention was measured under and what of `given` was not
    applied; None for the plain recipe (plans calibrated without recipe options stay as they were)."""
    if given.is_plain:
        return None
    record = measured.settings()
    if given.compile != "none":
        backend = "" if given.compile_backend == "inductor" else f" --compile-backend {given.compile_backend}"
        record["note"] = (f"--compile {given.compile}{backend} was not applied: compiling does not change what "
                          "attention sees (measured eagerly); the plan serves compiled runs too")
    return record


def _check_memory(source, jobs, device: str) -> None:
    """Refuse, with the estimate, a calibration whose denoising cannot fit in the device's free memory
    (it decodes nothing: the video stays latent)."""
    from sagevideo.generation.budget import available_bytes, format_bytes
    from sagevideo.generation.estimate import OVERHEAD_BYTES, estimate_job

    dev = resolve_device(device)
    dtype = "bfloat16" if dev.startswith("cuda") else "float32"
    estimate = estimate_job(source, jobs[0], "reference" if dev == "cpu" else "triton", dtype)
    need, free = estimate.weights + estimate.denoise + OVERHEAD_BYTES, available_bytes(dev)
    if free is not None and need > free:
        raise InputError(
            f"calibrating at {jobs[0].width}x{jobs[0].height}, {jobs[0].frames} frames needs about "
            f"{format_bytes(need)} ({estimate.tokens:,} tokens per attention call), but the {dev} has "
            f"{format_bytes(free)} free; use a smaller --width/--height or fewer --frames"
        )


def _generate_all(host, attention, jobs, backend, image_shas, bar) -> None:
    """Every job's latents through `host` under the attention hook `attention` (one calibration pass;
    the same seeds each pass, so a second pass sees the first pass's attention calls)."""
    from sagevideo.host.pipeline_host import PlannedJob

    host.attention = attention
    for number, job in enumerate(jobs, start=1):
        bar.set_postfix_str(f"prompt {number}/{len(jobs)}", refresh=True)
        pj = PlannedJob(job=job, job_id=f"calibrate-{number}", output=f"calibrate-{number}.mp4",
                        label=f"prompt {number}", backend=backend, image_sha256=(image_shas or {}).get(job.image))
        host.generate(pj, on_step=lambda step, steps: bar.update(1), decode=False)


def _run(source, jobs, out, captured, threshold, device, n_steps, save_qkv, progress, image_shas=None,
         recipe=None, plan_recipe=None, sparse=None, sparse_budget=None):
    """Generate every prompt's latents through the one generation path (a `PipelineHost` whose
    attention hook installs the probing router; `recipe`'s FP8 linears applied after it, before the
    first step), then choose and save the plan (its `recipe`: `plan_recipe`; `sparse`: `--sparse`'s
    text, whose ladder is measured and proposed per layer under `sparse_budget`; with :reuseN, lists
    reused over N steps where that meets it too)."""
    import sys

    from tqdm.auto import tqdm

    from sagevideo.host.pipeline_host import PipelineHost, RouterAttention, RunContext
    from sagevideo.pipelines.calibrate import DEFAULT_SPARSE_BUDGET, calibration_result, probing_router, top_p_router
    from sagevideo.pipelines.plans import Sparse
    from sagevideo.pipelines.sparse import first_sparse_layers

    dtype = "bfloat16" if device.startswith("cuda") else "float32"
    bar = tqdm(total=len(jobs) * n_steps, unit="step", desc="calibrate", disable=not progress, file=sys.stderr,
               dynamic_ncols=True)
    bar.set_postfix_str(f"loading {source.name if source.is_tiny else source.path.name}", refresh=True)

    def measured(layer: str, step: int | None) -> None:
        bar.set_postfix_str(f"measuring {layer} (step {step})", refresh=True)

    tensors: dict | None = {} if save_qkv is not None else None
    try:
        # Nothing is written: the video stays latent (out only names where the host would stage files).
        context = RunContext(out=out.parent, source=source, device=device, dtype=dtype, fps=source.default_fps,
                             recipe=recipe)
        host = PipelineHost(context)
        setting = Sparse.parse(sparse) if is_sparse(sparse) else None
        probe = probing_router(host.pipe, capture_steps=captured, save_qkv=tensors,
                               on_measure=measured if progress else None, sparse=setting, num_steps=n_steps)
        try:
            _generate_all(host, RouterAttention(probe), jobs, probe.backend, image_shas, bar)
            second = top_p_router(probe, threshold=threshold, dense_layers=first_sparse_layers(host.pipe),
                                  reuse_steps=setting.reuse_steps if setting else None)
            if second is not None:  # dynamic: the same prompts again, each layer on its calibrated top_p's
                bar.total += len(jobs) * n_steps
                host.close()  # the probe's router out, the second pass's in (the recipe stays applied)
                _generate_all(host, RouterAttention(second), jobs, probe.backend, image_shas, bar)
        finally:
            host.close()
        result = calibration_result(probe, host.pipe, threshold=threshold, num_steps=n_steps,
                                    sparse_budget=DEFAULT_SPARSE_BUDGET if sparse_budget is None else sparse_budget)
    finally:
        bar.close()
    if plan_recipe is not None:
        result.plan = result.plan.model_copy(update={"recipe": plan_recipe})
    result.plan.save(out)
    if save_qkv is not None:
        from safetensors.torch import save_file

        save_file(tensors, str(save_qkv))
    return result
