"""Model families: what sagevideo knows of each kind of video model, in one registry table.

A family is one folder of `sagevideo.pipelines` (`cogvideox/`, `opensora/`, ...) whose `family`
module defines `FAMILY`, a `ModelFamily`. Adding a family means adding that folder and one line
to `REGISTRY`; everything model-specific that generate, ab, calibrate and `--gpus-per-job` need is
asked of the family:

- detection and loading: the diffusers pipeline classes it loads (`model_index.json`'s
  `_class_name`), the weight folders a model folder must have, the built-in tiny models it
  serves, a `ModelSource` from configs alone (`tiny_source`, `folder_source`), `load`;
- job constraints: `job_problems` (frames rule, resolution multiple), `attention_layers` (the
  names plans use), the prompt length it pads to (`ModelSource.text_tokens`);
- generation: `denoise` (the pipeline call that returns latents) and `decode` (latents -> video),
  which `sagevideo.pipelines.runner.run_job` wraps with its checks and timings;
- attention routes: upstream processor class -> sagevideo processor class (`install`);
- sequence parallelism: `shard` (Ulysses hooks) and `degree_problem` (heads and tokens).

A family that is registered but does not `generate` (Open-Sora, until issue 20) still gives its
attention routes and sequence-parallel hooks to `install` and `shard`, and its folders are
refused by `generate` with a message that says so. Family modules import neither torch nor
diffusers at import time: detection runs on the driver, before anything loads.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sagevideo.jobs.specs import InputError, JobSpec, where

if TYPE_CHECKING:
    from sagevideo.pipelines.loading import ModelSource

# name -> module that defines FAMILY. One line per family.
REGISTRY: dict[str, str] = {
    "cogvideox": "sagevideo.pipelines.cogvideox.family",
    "opensora": "sagevideo.pipelines.opensora.family",
    "wan": "sagevideo.pipelines.wan.family",
}


class ModelFamily:
    """One model family; subclasses override what their models need (see the module docstring).

    name: the registry key (recorded in `ModelSource.family`); title: how messages name it.
    pipeline_classes: `model_index.json` `_class_name`s it loads; tiny_models: built-in model
    names it serves ("tiny"); weight_components: folders of a model folder that must hold
    safetensors. generates: whether generate/ab/calibrate run it; sequence_parallel: whether
    `--gpus-per-job` can split it.
    """

    name: str = ""
    title: str = ""
    pipeline_classes: tuple[str, ...] = ()
    tiny_models: tuple[str, ...] = ()
    weight_components: tuple[str, ...] = ("transformer", "vae", "text_encoder")
    generates: bool = True
    sequence_parallel: bool = False

    # --- detection and loading (configs only, then weights) ---

    def tiny_source(self, name: str) -> ModelSource:
        raise NotImplementedError(f"the {self.title} family has no built-in tiny model")

    def folder_source(self, path: Path, index: dict[str, Any], model: str) -> ModelSource:
        """The `ModelSource` of a checked local folder (model_index.json read as `index`)."""
        raise NotImplementedError(f"sagevideo does not load {self.title} folders yet")

    def load(self, source: ModelSource, device: str, dtype: Any) -> Any:
        """The pipeline on `device` in `dtype` (local files only)."""
        raise NotImplementedError(f"sagevideo does not load {self.title} pipelines yet")

    # --- job constraints ---

    def job_problems(self, source: ModelSource, job: JobSpec) -> list[str]:
        """Why this model cannot make a resolved job ('<field>: <problem>; use e.g. ...'), or []."""
        return []

    def attention_layers(self, source: ModelSource) -> list[str]:
        """Names of the transformer's attention layers, as plans and `install` name them (configs only)."""
        return []

    # --- generation ---

    def denoise(self, pipe: Any, job: JobSpec, *, generator: Any, text_tokens: int,
                callback: Callable[[Any, int, Any, dict], dict]) -> Any:
        """Run the pipeline's denoising loop for a resolved job; returns the latents. callback:
        diffusers' `callback_on_step_end(pipeline, step, timestep, tensors)` with "latents"."""
        raise NotImplementedError(f"sagevideo does not generate with {self.title} yet")

    def decode(self, pipe: Any, job: JobSpec, latents: Any) -> Any:
        """Latents -> video (1, 3, F, H, W) in [-1, 1], before any clamping (NaN/Inf stay visible)."""
        raise NotImplementedError(f"sagevideo does not generate with {self.title} yet")

    def postprocess(self, pipe: Any, video: Any) -> Any:
        """Decoded video -> (F, H, W, 3) floats in [0, 1]."""
        return pipe.video_processor.postprocess_video(video=video, output_type="np")[0]

    # --- attention routes ---

    def processor_routes(self) -> dict[type, Any]:
        """Upstream processor class -> sagevideo processor class that keeps its behaviour."""
        return {}

    # --- sequence parallelism ---

    def shardable(self, source: ModelSource) -> str | None:
        """None when `shard` can split this model, else what it is (for the refusal)."""
        return None if self.sequence_parallel else source.pipeline_class

    def shard(self, pipe_or_transformer: Any, *, group: Any = None, plan: Any = None, pv: str | None = None,
              backend: str = "auto") -> Any:
        """Install Ulysses sequence parallelism with sagevideo attention; a handle with `remove()`."""
        raise NotImplementedError(f"sagevideo does not split {self.title} over ranks")

    def degree_problem(self, source: ModelSource, job: JobSpec, degree: int) -> str | None:
        """Why `degree` ranks cannot split a resolved job (heads are checked for the batch), or None."""
        return None

    def __repr__(self) -> str:
        return f"<ModelFamily {self.name}>"


@cache
def get(name: str) -> ModelFamily:
    """The registered family `name` (KeyError naming the known ones)."""
    if name not in REGISTRY:
        raise KeyError(f"no model family {name!r}; registered: {sorted(REGISTRY)}")
    family = importlib.import_module(REGISTRY[name]).FAMILY
    if family.name != name:
        raise RuntimeError(f"{REGISTRY[name]}.FAMILY is named {family.name!r}, registered as {name!r}")
    return family


def every() -> list[ModelFamily]:
    """Every registered family, in registry order."""
    return [get(name) for name in REGISTRY]


def for_pipeline_class(class_name: str | None) -> ModelFamily | None:
    """The family that loads pipelines of `class_name`, or None."""
    return next((f for f in every() if class_name in f.pipeline_classes), None)


def for_tiny(model: str) -> ModelFamily | None:
    """The family whose built-in tiny model is called `model`, or None."""
    return next((f for f in every() if model in f.tiny_models), None)


def of_pipeline(pipe: Any) -> ModelFamily:
    """The family of a loaded pipeline (by its class), e.g. for `runner.run_job` without a source."""
    family = for_pipeline_class(type(pipe).__name__)
    if family is None:
        raise TypeError(f"{type(pipe).__name__} is not a pipeline of a registered model family ({sorted(REGISTRY)})")
    return family


def generated_pipeline_classes() -> list[str]:
    """Pipeline classes `sagevideo generate` runs."""
    return [cls for f in every() if f.generates for cls in f.pipeline_classes]


def processor_routes() -> dict[type, Any]:
    """Every family's attention routes (what `install` swaps)."""
    routes: dict[type, Any] = {}
    for family in every():
        routes.update(family.processor_routes())
    return routes


def size_problems(source: ModelSource, job: JobSpec) -> list[str]:
    """Height and width that are not multiples of the VAE's spatial factor times the patch size
    (the job constraint every latent-patch video model has), with the nearest sizes that are."""
    size = source.spatial * source.patch
    problems = []
    for field in ("height", "width"):
        value = getattr(job, field)
        if value % size:
            lower = value // size * size
            near = f"{lower} or {lower + size}" if lower else f"{size}"
            problems.append(
                f"{field}: {value} px is not a multiple of {size} "
                f"(VAE {source.spatial}x times patch {source.patch}); use e.g. {near}"
            )
    return problems


def degree_problems(source: ModelSource, jobs: list[tuple[JobSpec, Any]], degree: int) -> list[tuple[str, str]]:
    """(where, problem) for each resolved (job, label) that `degree` ranks cannot split, from configs
    alone, so a bad `--gpus-per-job` is refused before any model loads.

    Raises InputError at once for what concerns the whole batch (a bad degree, a model its family
    cannot split, heads not divisible by the degree). degree 1 has no problems.
    """
    if isinstance(degree, bool) or not isinstance(degree, int) or degree < 1:
        raise InputError(f"--gpus-per-job {degree}: give a whole number >= 1 (1: one GPU per job, no splitting)")
    if degree == 1:
        return []
    family = get(source.family)
    what = family.shardable(source) if family.generates else source.pipeline_class
    if what is not None:
        able = [f.title for f in every() if f.generates and f.sequence_parallel]
        raise InputError(
            f"--gpus-per-job {degree}: sequence parallelism splits {', '.join(able)} transformers only; "
            f"{source.name} is a {what}. Use --gpus-per-job 1 (one GPU per job; --workers spreads jobs over GPUs)"
        )
    heads = source.heads
    if heads % degree:  # decides for the whole batch
        usable = [d for d in range(1, heads + 1) if heads % d == 0]
        raise InputError(
            f"--gpus-per-job {degree}: the {heads} attention heads of {source.name} are not divisible by "
            f"{degree} (each rank attends over whole heads); use one of {usable}"
        )
    problems = []
    for job, label in jobs:
        problem = family.degree_problem(source, job, degree)
        if problem:
            problems.append((where(label, "frames"), f"--gpus-per-job {degree}: {problem} (frames {job.frames}, "
                             f"{job.width}x{job.height} px)"))
    return problems
