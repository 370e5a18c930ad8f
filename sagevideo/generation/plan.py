"""Plan a batch of video jobs without loading a model: every input problem is found here.

`plan_batch(config)` takes a `GenerateConfig` (or prompts/jobs and keyword options, which build
one) and composes one entry of each room: the machine (device, dtype, an mp4 encoder), the jobs
room loads the batch (`sagevideo.jobs.batch.load_batch`: job file, recipe layering, jobs), the
pipelines room checks it against the model (`sagevideo.pipelines.batch_check.check_batch`), the
attention registry gives each job's backend (`sagevideo.generation.backends`), the scheduling
room chooses where it runs (`sagevideo.scheduling.executor`), the memory budget refuses what
cannot fit (`sagevideo.generation.budget`), and the jobs room names the jobs (`sagevideo.jobs.naming`).
It returns a `BatchPlan` for `sagevideo.generation.run.run_batch`, or raises `InputError` naming
each bad field and its fix.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sagevideo.choices import resolve_device, resolve_pv
from sagevideo.errors import InputError
from sagevideo.generation.backends import BackendKey, resolve_backends
from sagevideo.generation.budget import budget_problems
from sagevideo.host.pipeline_host import PlannedJob, RunContext
from sagevideo.jobs.batch import Problem, load_batch
from sagevideo.jobs.config import GenerateConfig
from sagevideo.jobs.naming import NamedJob, identity_settings, name_jobs
from sagevideo.jobs.problems import group_problems
from sagevideo.jobs.specs import JobSpec
from sagevideo.outputs.encoder import encoder_problem
from sagevideo.outputs.manifest import MANIFEST_NAME
from sagevideo.pipelines.batch_check import CheckedBatch, check_batch
from sagevideo.pipelines.loading import ModelSource
from sagevideo.scheduling.executor import choose_executor
from sagevideo.scheduling.spec import SchedulingSpec

PromptsOrJobs = (
    str | Path | Mapping[str, Any] | JobSpec | Iterable[str | Mapping[str, Any] | JobSpec] | None
)

__all__ = ["BatchPlan", "GenerateConfig", "PromptsOrJobs", "plan_batch", "resolve_pv"]


@dataclass
class BatchPlan:
    """Everything `run_batch` needs; built by `plan_batch` without loading any model.

    settings: the batch's `GenerateConfig`, with pv resolved ("auto" -> fp8/fp16 for the device).
    backend: the `sageattn` backend of the batch's default attention/pv, or None for "full"
    (each PlannedJob has its own). notes: facts the user should see before the run (e.g. why CPU
    runs the emulation). use_ray: run on Ray workers (`address`: None = a local instance, "auto",
    or HOST:PORT; `workers`: None = one per GPU, or per node on CPU). max_attempts: runs of a job
    whose worker died before it is marked failed. gpus_per_job: ranks that share each job by
    sequence parallelism (> 1: Ray groups of that many ranks; `workers` then counts groups).
    job_timeout: seconds a job may run (None: no limit); see `GenerateConfig.job_timeout`.
    """

    out: Path
    settings: GenerateConfig
    source: ModelSource
    device: str
    dtype: str
    backend: str | None
    jobs: list[PlannedJob]
    notes: list[str] = field(default_factory=list)
    use_ray: bool = False
    address: str | None = None
    workers: int | None = None
    max_attempts: int = 3
    gpus_per_job: int = 1
    job_timeout: float | None = None

    @property
    def manifest_path(self) -> Path:
        return self.out / MANIFEST_NAME

    def context(self) -> RunContext:
        """What each worker needs (no jobs)."""
        return RunContext(
            out=self.out, source=self.source, device=self.device, dtype=self.dtype, fps=self.settings.fps,
            recipe=self.settings.recipe, attention_guard=self.settings.attention_guard,
        )

    def scheduling(self) -> SchedulingSpec:
        """What the Ray scheduler needs of this batch (`sagevideo.scheduling.run_jobs`)."""
        return SchedulingSpec(
            context=self.context(), address=self.address, workers=self.workers, ranks=self.gpus_per_job,
            max_attempts=self.max_attempts, job_timeout=self.job_timeout,
        )


def plan_batch(
    config: GenerateConfig | PromptsOrJobs = None, /, *, use_file_recipe: bool = True, ab_arm: bool = False,
    **options: Any,
) -> BatchPlan:
    """Validate a batch and resolve everything about it without loading a model.

    config: a `GenerateConfig`, or the prompts/jobs of one whose other options are the keyword
    arguments (`options` also override a given config's). Every option is a field of
    `GenerateConfig`, with its default and meaning. frames/height/width/steps left as None take
    the model's defaults. Precedence of job fields: a job's own value > a job file's `defaults` >
    these options > the model's defaults. Jobs whose estimated peak memory exceeds what the device
    has free are refused with the estimate (`sagevideo.generation.estimate`); large CPU jobs get a
    note with their measured attention time.
    A job file's `recipe:` section gives the recipe options the config leaves at their defaults
    (`sagevideo.jobs.recipe.layer_recipe`; a different value in both is an error naming both
    places); the resolved recipe is what is checked, recorded and part of the job ids.
    use_file_recipe: False plans without that section (`sagevideo ab`'s full-precision arms run
    plain; its values are still checked).
    ab_arm: True when `sagevideo ab` plans one of its arms; any other run is refused an --out that
    an ab run marked (`sagevideo.outputs.folders.ab_folder_problem`).
    Raises InputError naming each bad field and its fix (bad options among them, each once).
    """
    config = GenerateConfig.build(config, **options)
    device, dtype, machine_problems = _machine(config)
    pv = resolve_pv(config.pv, device) if device is not None else None
    batch = load_batch(config, pv=pv, use_file_recipe=use_file_recipe)
    problems = [*batch.problems, *machine_problems]
    if device is None:  # a device this process cannot use: checking the jobs against the model would only add noise
        _refuse(problems)
    settings = batch.config.model_copy(update={"pv": pv})
    checked = check_batch(batch, settings, device, dtype, problems)
    _refuse(checked.problems)
    source = checked.source
    if settings.fps is None:  # the frame rate the model's videos are made for
        settings = settings.model_copy(update={"fps": source.default_fps})
    backends, default_backend, backend_notes = resolve_backends(settings, checked.jobs, source, device, dtype)
    use_ray, execution_notes = choose_executor(settings.address, settings.workers, device, settings.gpus_per_job)
    # On CUDA only for a run in this process: a driver that Ray workers serve must not take a GPU context.
    here = settings.address is None and not (use_ray and device == "cuda")
    problems, estimate_notes = budget_problems(source, checked.jobs, backends, device, dtype, settings.job_timeout,
                                               local=here, recipe=settings.recipe)
    _refuse(problems)
    naming = name_jobs(checked.jobs, _identity_settings(settings, checked, backends, dtype))
    _refuse(naming.problems)
    out_dir = _prepare_out_dir(settings.out, ab_arm)  # last: the only check that writes (it may create the folder)
    return BatchPlan(
        out=out_dir,
        settings=settings,
        source=source,
        device=device,
        dtype=dtype,
        backend=default_backend,
        jobs=[_planned(named, backends, checked) for named in naming.jobs],
        notes=[*batch.notes, *checked.notes, *backend_notes, *execution_notes, *estimate_notes, *naming.notes],
        use_ray=use_ray,
        address=settings.address,
        workers=settings.workers,
        max_attempts=settings.max_attempts,
        gpus_per_job=settings.gpus_per_job,
        job_timeout=None if settings.job_timeout is None else float(settings.job_timeout),
    )


def _refuse(problems: list[Problem]) -> None:
    """Raise one InputError listing every problem, each once (nothing when there are none)."""
    if problems:
        raise InputError(group_problems(problems))


def _machine(config: GenerateConfig) -> tuple[str | None, str | None, list[Problem]]:
    """(device, dtype, problems) of this machine for the batch: an mp4 encoder (without one, every
    job would render and then fail at the write) and the device (None, with why, when unusable)."""
    encoder = encoder_problem()
    problems: list[Problem] = [("", encoder)] if encoder else []
    try:
        device, dtype = _resolve_device(config)
    except InputError as err:
        return None, None, [*problems, ("", str(err))]
    return device, dtype, problems


def _identity_settings(
    settings: GenerateConfig, checked: CheckedBatch, backends: Mapping[BackendKey, str | None], dtype: str
) -> Callable[[JobSpec], dict[str, Any]]:
    """A resolved job -> the settings besides its fields that change its output (`identity_settings`)."""
    source, recipe = checked.source, settings.recipe

    def settings_of(job: JobSpec) -> dict[str, Any]:
        return identity_settings(
            fingerprint=source.fingerprint,
            backend=backends[(job.attention, job.pv)],
            dtype=dtype,
            fps=settings.fps,
            plan_sha256=checked.plan_shas.get(job.plan),
            tiny_model=source.name if source.is_tiny else None,
            image_sha256=checked.image_shas[job.image] if job.image is not None else None,
            recipe=None if recipe.is_plain else recipe.settings(),  # fp8 linears and caches change the video
        )

    return settings_of


def _planned(named: NamedJob, backends: Mapping[BackendKey, str | None], checked: CheckedBatch) -> PlannedJob:
    """The job as the hosts run it: its name, backend and the content hashes of its plan and image."""
    j = named.job
    return PlannedJob(
        job=j,
        job_id=named.job_id,
        output=named.output,
        label=str(named.label),
        backend=backends[(j.attention, j.pv)],
        plan_sha256=checked.plan_shas.get(j.plan),
        image_sha256=checked.image_shas.get(j.image) if j.image is not None else None,
        identity=named.identity,
    )


def _prepare_out_dir(out: str | Path, ab_arm: bool = False) -> Path:
    """Create the output folder if needed and prove it is writable (a probe file); refuse a folder
    of a `sagevideo ab` run unless ab plans it (ab_arm): ab would set aside what this run wrote; and
    one whose manifest a newer sagevideo wrote to."""
    from sagevideo.outputs.folders import ab_folder_problem, writable_folder
    from sagevideo.outputs.manifest import Manifest

    problem = None if ab_arm else ab_folder_problem(out)
    if problem:
        raise InputError(problem)
    path = writable_folder(out, InputError, "; give a folder for the videos and manifest")
    manifest = path / MANIFEST_NAME
    if manifest.exists() and (not manifest.is_file()):
        raise InputError(f"--out {out}: {MANIFEST_NAME} there is not a file; remove it or use another folder")
    problem = Manifest(manifest).newer_schema_problem()
    if problem:
        raise InputError(f"--out {out}: {problem}")
    return path



def _resolve_device(settings: GenerateConfig) -> tuple[str, str]:
    """(device, dtype name): auto -> CUDA when torch sees a GPU; dtype bf16 on CUDA, fp32 on CPU."""
    device = resolve_device(settings.device)
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise InputError(f"--device cuda: torch {torch.__version__} sees no CUDA GPU; use --device cpu or auto")
    dtype = settings.dtype or ("bfloat16" if device == "cuda" else "float32")
    return device, dtype
