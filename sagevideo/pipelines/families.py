"""Model families: what sagevideo knows of each kind of video model, in one registry table.

A family is one folder of `sagevideo.pipelines` (`cogvideox/`, `opensora/`, ...) whose `family`
module defines `FAMILY`, a `ModelFamily` (one family serves its text- and image-to-video
pipelines alike: `image_input` tells them apart per model). Adding a family means adding that folder and one line
to `REGISTRY`; everything model-specific that generate, ab, calibrate and `--gpus-per-job` need is
asked of the family:

- detection and loading: the diffusers pipeline classes it loads (`model_index.json`'s
  `_class_name`), the weight folders a model folder must have, the built-in tiny models it
  serves, a `ModelSource` from configs alone (`tiny_source`, `folder_source`), `load`;
- job constraints: `job_problems` (frames rule, resolution multiple), `job_notes` (what a job
  runs that differs from what it says: prompt tokens dropped), `attention_layers` (the names plans
  use), the prompt length it pads to (`ModelSource.text_tokens`);
- input images: `image_input(source)` ("required": image-to-video, "optional", None: text only), checked
  for every job before loading (`image_use_problem`, then the family's `image_problems` hook on
  the read image); where the job runs, `prepare_image` turns the decoded image into what
  `denoise` receives as `image=` (only families that take images are given one);
- generation: `denoise` (the pipeline call that returns latents) and `decode` (latents -> video),
  which `sagevideo.pipelines.runner.run_job` wraps with its checks and timings;
- attention routes: upstream processor class -> sagevideo processor class (`install`), and the
  layers whose materialized masks are key padding (`key_padding_layers`, `pipelines.masks`);
- block-sparse attention: `sparse_layout` (which layers may be sparse, where their text sits, and
  the latent grid of a forward: `SparseLayout`);
- sequence parallelism: `shard` (Ulysses hooks) and `degree_problem` (heads and tokens).

A family that is registered but does not `generate` (HunyuanVideo 1.5, LTX-Video: their routes
only) still gives its attention routes to `install`, so a user's own pipeline of that kind runs
sagevideo attention, and its folders are refused by `generate` with a message that says so.
Family modules import neither torch nor diffusers at import time: detection runs on the driver, before anything loads.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sagevideo.errors import InputError
from sagevideo.jobs.problems import where
from sagevideo.jobs.specs import JobSpec

if TYPE_CHECKING:
    from sagevideo.jobs.images import ImageInfo
    from sagevideo.pipelines.loading import ModelSource

# name -> module that defines FAMILY. One line per family.
REGISTRY: dict[str, str] = {
    "cogvideox": "sagevideo.pipelines.cogvideox.family",
    "opensora": "sagevideo.pipelines.opensora.family",
    "hunyuanvideo": "sagevideo.pipelines.hunyuanvideo.family",
    "wan": "sagevideo.pipelines.wan.family",
    "hunyuanvideo15": "sagevideo.pipelines.hunyuanvideo15.family",
    "ltx": "sagevideo.pipelines.ltx.family",
}


TEXT_FIRST, TEXT_LAST = "first", "last"  # where joint attention's text sits in the sequence


@dataclass(frozen=True)
class SparseLayout:
    """What block-sparse tile selection needs of one transformer, declared by its family.

    text: layer name (as `install` names it, without a denoiser's prefix) -> where the text tokens of
    its self-attention sequence sit: TEXT_FIRST ([text; video]), TEXT_LAST ([video; text]) or None
    (video only). Layers absent (cross-attention, text-only layers) are never sparse.
    grid: (transformer, forward args, forward kwargs) -> the latent grid (frames, height, width) of
    the video tokens after patching, in the sequence's raster order, or None when the inputs do not
    say (read before each forward, outside any compiled graph)."""

    text: dict[str, str | None]
    grid: Callable[[Any, tuple, dict], tuple[int, int, int] | None]


def is_exactly(obj: Any, module: str, name: str) -> bool:
    """Whether `obj` is an instance of exactly class `module.name` (not a subclass, which may change
    what a family relies on); the module is imported only when the class name already matches."""
    if type(obj).__name__ != name:
        return False
    return type(obj) is getattr(importlib.import_module(module), name)


def forward_input(args: tuple, kwargs: dict, name: str, index: int = 0) -> Any:
    """A forward's input `name`, given by keyword or at position `index` (None when absent)."""
    if name in kwargs:
        return kwargs[name]
    return args[index] if len(args) > index else None


class ModelFamily:
    """One model family; subclasses override what their models need (see the module docstring).

    name: the registry key (recorded in `ModelSource.family`); title: how messages name it.
    pipeline_classes: `model_index.json` `_class_name`s it loads; tiny_models: built-in model
    names it serves ("tiny"); weight_components: folders of a model folder that must hold
    safetensors. generates: whether generate/ab/calibrate run it; sequence_parallel: whether
    `--gpus-per-job` can split it. step_caches: the `--cache` values its transformer takes.
    image_pipeline_classes: those of pipeline_classes that start
    from an input image (see `image_input`).
    """

    name: str = ""
    title: str = ""
    pipeline_classes: tuple[str, ...] = ()
    tiny_models: tuple[str, ...] = ()
    weight_components: tuple[str, ...] = ("transformer", "vae", "text_encoder")
    generates: bool = True
    sequence_parallel: bool = False
    image_pipeline_classes: tuple[str, ...] = ()
    # diffusers step caches (`Recipe.cache`) its transformer takes: a diffusers CacheMixin whose
    # blocks diffusers' TransformerBlockRegistry knows
    step_caches: tuple[str, ...] = ("first-block", "taylorseer", "pyramid-broadcast")

    # --- detection and loading (configs only, then weights) ---

    def tiny_source(self, name: str) -> ModelSource:
        raise NotImplementedError(f"the {self.title} family has no built-in tiny model")

    def folder_source(self, path: Path, index: dict[str, Any], model: str) -> ModelSource:
        """The `ModelSource` of a checked local folder (model_index.json read as `index`)."""
        raise NotImplementedError(f"sagevideo does not load {self.title} folders yet")

    def unconverted_hint(self, path: Path) -> str | None:
        """For a folder without model_index.json: how to make it loadable when it holds this family's
        model in another layout (e.g. an official download to convert), else None."""
        return None

    def load(self, source: ModelSource, device: str, dtype: Any) -> Any:
        """The pipeline on `device` in `dtype` (local files only)."""
        raise NotImplementedError(f"sagevideo does not load {self.title} pipelines yet")

    # --- job constraints ---

    def job_problems(self, source: ModelSource, job: JobSpec) -> list[str]:
        """Why this model cannot make a resolved job ('<field>: <problem>; use e.g. ...'), or []."""
        return []

    def job_notes(self, source: ModelSource, job: JobSpec) -> list[str]:
        """What the user should know of a resolved job this model makes differently from what it says
        ('<field>: <what>', e.g. prompt tokens the text encoder drops), or []."""
        return []

    def attention_tokens(self, source: ModelSource, job: JobSpec) -> int:
        """Tokens of the longest attention call of a resolved job (what memory and time scale
        with). Default: video patches plus the text the transformer attends to jointly."""
        frames, rows, columns = patch_grid(source, job)
        return frames * rows * columns + source.text_tokens

    def forward_batch(self, source: ModelSource, job: JobSpec) -> int:
        """Batch of one transformer forward of a resolved job. Default: 2 under classifier-free
        guidance (both halves in one call, as CogVideoXPipeline does), else 1."""
        return 2 if job.guidance > 1 else 1

    def attention_layers(self, source: ModelSource) -> list[str]:
        """Names of the transformer's attention layers, as plans and `install` name them (configs only)."""
        return []

    def image_input(self, source: ModelSource) -> str | None:
        """Whether this model's jobs give an input image: "required" (image-to-video), "optional"
        (a model that makes video from text or from a first frame), or None (text only: refused).
        Default: "required" for `image_pipeline_classes`, else None."""
        return "required" if source.pipeline_class in self.image_pipeline_classes else None

    def image_problems(self, source: ModelSource, job: JobSpec, image: ImageInfo) -> list[str]:
        """Why this model cannot start a resolved job from its input image (read and decoded
        already; asked only of families that take images), as 'image: <problem>; <fix>', or [].
        Default: the aspect rule of `image_fit_problems` (the image is resized to the job's size)."""
        return image_fit_problems(source, job, image)

    # --- generation ---

    def prepare_image(self, image: Any, job: JobSpec) -> Any:
        """A job's decoded input image ((H, W, 3) uint8 RGB, `sagevideo.jobs.images.read_image`) ->
        what `denoise` receives: by default a PIL RGB image at the job's width x height (Lanczos)."""
        from PIL import Image

        from sagevideo.jobs.images import as_pil

        picture = as_pil(image)
        if picture.size != (job.width, job.height):
            picture = picture.resize((job.width, job.height), Image.Resampling.LANCZOS)
        return picture

    def denoise(self, pipe: Any, job: JobSpec, *, generator: Any, text_tokens: int,
                callback: Callable[[Any, int, Any, dict], dict], image: Any = None) -> Any:
        """Run the pipeline's denoising loop for a resolved job; returns the latents. callback:
        diffusers' `callback_on_step_end(pipeline, step, timestep, tensors)` with "latents".
        image: the job's input image as `prepare_image` made it, passed only to families that take
        images (a text-to-video family's `denoise` need not accept it)."""
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

    def key_padding_layers(self, transformer: Any) -> dict[str, Any]:
        """Layer name (as `install` names it, without a denoiser's prefix) -> `masks.KeyPadding`, for the
        layers of `transformer` whose SDPA masks this family knows to be key padding however
        materialized (over heads or queries, as a query mask x key mask, as an additive float): `install`
        reads them back as key masks where they are (`sagevideo.pipelines.masks`). {} for transformers
        of other families (exact class)."""
        return {}

    # --- block-sparse attention ---

    def sparse_layout(self, transformer: Any) -> SparseLayout | None:
        """The `SparseLayout` of `transformer` when it is this family's (exact class), else None
        (its layers then never run sparse: a sparse plan records them dense with the reason)."""
        return None

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


def sparse_layout(transformer: Any) -> SparseLayout | None:
    """The `SparseLayout` the registered families declare for `transformer`, or None."""
    for family in every():
        layout = family.sparse_layout(transformer)
        if layout is not None:
            return layout
    return None


def key_padding_layers(transformer: Any) -> dict[str, Any]:
    """Every family's `key_padding_layers` of `transformer` (what `install` reads back as key masks)."""
    layers: dict[str, Any] = {}
    for family in every():
        layers.update(family.key_padding_layers(transformer))
    return layers


def latent_call_options(job: JobSpec, *, generator: Any, callback: Any, text_tokens: int) -> dict[str, Any]:
    """The pipeline-call options every family's `denoise` passes: the resolved job's size, steps and
    guidance, latents returned undecoded, `callback` after each step on the latents, and the
    prompt-token limit."""
    return dict(
        height=job.height,
        width=job.width,
        num_frames=job.frames,
        num_inference_steps=job.steps,
        guidance_scale=job.guidance,
        generator=generator,
        output_type="latent",
        return_dict=False,
        callback_on_step_end=callback,
        callback_on_step_end_tensor_inputs=["latents"],
        max_sequence_length=text_tokens,
    )


def patch_grid(source: ModelSource, job: JobSpec) -> tuple[int, int, int]:
    """(latent frames, rows, columns) of transformer patches for a resolved job: the VAE compresses
    time after the first frame and space by `spatial`, the transformer patches space by `patch`."""
    size = source.spatial * source.patch
    return (job.frames - 1) // source.temporal + 1, job.height // size, job.width // size


def ulysses_degree_problem(check: Callable[..., None], config: Any, source: ModelSource, job: JobSpec,
                           degree: int) -> str | None:
    """A sequence-parallel module's degree check `check(config, latent_frames, latent_height,
    latent_width, degree)` (it raises ValueError 'Ulysses degree N: <problem>') on a resolved job's
    latent size, as `ModelFamily.degree_problem` answers: the problem (the caller names the option), or None."""
    try:
        check(config, (job.frames - 1) // source.temporal + 1, job.height // source.spatial,
              job.width // source.spatial, degree)
    except ValueError as err:
        return str(err).split(": ", 1)[-1]
    return None


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


# How far an input image's aspect ratio may be from the job's before the resize would visibly
# stretch it (2%: e.g. 1920x1080 made into 848x480).
ASPECT_TOLERANCE = 0.02


def image_tiny_models() -> list[str]:
    """Built-in tiny models that take an input image (for messages)."""
    return [name for f in every() if f.generates for name in f.tiny_models if f.image_input(f.tiny_source(name))]


def image_models_text() -> str:
    """The models that take an input image, for messages: 'tiny-a, tiny-b, or a P or Q folder'."""
    classes = [c for f in every() if f.generates for c in f.image_pipeline_classes]
    folders = ", ".join(classes[:-1]) + (f" or {classes[-1]}" if len(classes) > 1 else "".join(classes))
    return ", ".join(image_tiny_models()) + (f", or a {folders} folder" if classes else "")


def image_use_problem(source: ModelSource, job: JobSpec) -> str | None:
    """'image: ...' when a job gives an image to a model that takes none, or none to one that
    requires it (the family's `image_input`, before any image is read), else None."""
    takes = source.model_family.image_input(source)
    if job.image is not None and takes is None:
        use = f", or use a model that takes one ({image_models_text()})" if image_tiny_models() else ""
        return (f"image: {source.name} is a text-to-video model ({source.pipeline_class}) and takes no image; "
                f"leave image out{use}")
    if job.image is None and takes == "required":
        return (f"image: missing; {source.name} is an image-to-video model ({source.pipeline_class}): every job "
                "needs an image to start from (image: in the job file, or --image)")
    return None


def image_fit_problems(source: ModelSource, job: JobSpec, image: ImageInfo) -> list[str]:
    """An image whose aspect ratio differs from the job's by more than ASPECT_TOLERANCE, which
    the resize to the job's size would stretch, with a resolution of the image's shape near the
    job's; any other size is resized (up or down) where the job runs."""
    ratio, want = image.width / image.height, job.width / job.height
    if abs(math.log(ratio / want)) <= math.log1p(ASPECT_TOLERANCE):
        return []
    size = source.spatial * source.patch
    width = max(size, round(job.height * ratio / size) * size)
    shape = Fraction(job.width, job.height)
    return [
        f"image: {Path(image.path).name} is {image.size} (aspect {ratio:.3g}) but the job makes "
        f"{job.width}x{job.height} (aspect {want:.3g}), so resizing would stretch it; crop the image to "
        f"{shape.numerator}:{shape.denominator}, or set resolution to one of its shape, e.g. {width}x{job.height}"
    ]


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
