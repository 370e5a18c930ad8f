"""Model sources: check a model before loading it, then load it (local files only).

`resolve_model("tiny" | path)` reads only JSON configs and safetensors headers, so every problem
(missing folder, no model_index.json, a pipeline no registered family generates, missing, truncated
or corrupt safetensors, a config value of the wrong type, a symlink loop: `folder_check`, a video
size the model cannot make) is reported before any weights are read. Which family a model belongs to
comes from the registry (`sagevideo.pipelines.families`): its built-in tiny names, or the
folder's `model_index.json` `_class_name`. `load_pipeline` then has the family load it (the tiny
model is built, a folder goes through diffusers' `from_pretrained(local_files_only=True,
use_safetensors=True)`).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sagevideo.errors import InputError
from sagevideo.jobs.specs import JobSpec
from sagevideo.pipelines.fingerprint import fingerprint, folder_fingerprint

__all__ = ["ModelSource", "fingerprint", "folder_fingerprint", "load_pipeline", "read_json", "resolve_model"]


@dataclass(frozen=True)
class ModelSource:
    """A model that passed the pre-load checks, with what jobs need to know about it.

    name: "tiny" or the absolute folder path. fingerprint: 12 hex digits that change when the
    model does and only then (tiny: its configs and seed; a folder: the content of every file it is
    loaded from, not its path: `sagevideo.pipelines.fingerprint`), so outputs of an older model are
    not taken as done and a copied folder is the same model. family: its `sagevideo.pipelines.families`
    name, which answers every model-specific question. spatial/temporal: VAE compression factors;
    patch: transformer patch size (height and width must be multiples of spatial*patch).
    text_tokens: the prompt length the pipeline pads to (longer prompts are cut).
    layers: number of transformer blocks. vae_channels: channels of the VAE decoder at full
    resolution (what its memory scales with). default_fps: the mp4 frame rate when the batch
    names none (the rate the model was trained at). default_guidance: the guidance scale of jobs
    that give none (the model's published sampling setting).
    """

    name: str
    path: Path | None
    fingerprint: str
    pipeline_class: str
    heads: int
    head_dim: int
    spatial: int
    temporal: int
    patch: int
    text_tokens: int
    default_height: int
    default_width: int
    default_frames: int
    default_steps: int
    layers: int = 30
    vae_channels: int = 128
    family: str = "cogvideox"
    default_fps: int = 8
    default_guidance: float = 6.0

    @property
    def is_tiny(self) -> bool:
        return self.path is None

    @property
    def model_family(self) -> Any:
        """The `ModelFamily` of this model."""
        from sagevideo.pipelines import families

        return families.get(self.family)

    @property
    def attention_layers(self) -> list[str]:
        """Names of the transformer's attention layers, as plans and `install` name them, from the
        config alone (CogVideoX: one `attn1` per block)."""
        return self.model_family.attention_layers(self)

    def resolve(self, job: JobSpec) -> JobSpec:
        """The job with unset size/steps/guidance filled from this model's defaults."""
        return job.model_copy(
            update={
                "height": job.height or self.default_height,
                "width": job.width or self.default_width,
                "frames": job.frames or self.default_frames,
                "steps": job.steps or self.default_steps,
                "guidance": self.default_guidance if job.guidance is None else job.guidance,
            }
        )

    def problems(self, job: JobSpec) -> list[str]:
        """Why this model cannot make a resolved job ('<field>: <problem>; use e.g. ...'), or []."""
        return self.model_family.job_problems(self, job)

    def notes(self, job: JobSpec) -> list[str]:
        """What this model makes of a resolved job that differs from what it says ('<field>: ...'), or []."""
        return self.model_family.job_notes(self, job)


def resolve_model(model: str) -> ModelSource:
    """Check a built-in tiny model's name or a local diffusers folder without loading weights."""
    from sagevideo.pipelines import families

    family = families.for_tiny(model)
    if family is not None:
        return family.tiny_source(model)
    tiny = [name for f in families.every() for name in f.tiny_models]
    path = Path(model).expanduser()
    if path.is_symlink() and not path.exists():
        why = "a symlink loop" if _loops(path) else "a symlink to nothing"
        raise InputError(f"--model {model}: {why} ({path} -> {os.readlink(path)}); give the model folder itself")
    if not path.exists():
        raise InputError(
            f"--model {model}: no such folder; give {' or '.join(repr(t) for t in tiny)} or a local diffusers "
            "folder (nothing is downloaded)"
        )
    if not path.is_dir():
        raise InputError(f"--model {model}: is a file; give the diffusers folder that holds model_index.json")
    if not (path / "model_index.json").exists():
        for family in families.every():
            hint = family.unconverted_hint(path)
            if hint:
                raise InputError(f"--model {model}: {hint}")
    index = read_json(
        path / "model_index.json",
        f"--model {model}",
        "give the diffusers folder that holds model_index.json (a save_pretrained output)",
    )
    cls = index.get("_class_name")
    family = families.for_pipeline_class(cls)
    if family is None or not family.generates:
        uses = "install and sequence parallelism" if family is not None and family.sequence_parallel else "install"
        known = f" (the {family.title} family is registered for {uses}, not yet for generate)" \
            if family is not None else ""
        raise InputError(
            f"--model {model}: model_index.json names {cls!r}{known}; sagevideo generate runs "
            f"{', '.join(families.generated_pipeline_classes())}"
        )
    from sagevideo.pipelines.folder_check import folder_problems

    broken = folder_problems(path, index)
    if broken:  # one line each: a truncated shard, a config value of the wrong type, a symlink loop
        raise InputError("\n".join(f"--model {model}: {place}: {problem}" for place, problem in broken))
    for component in family.weight_components:
        folder = path / component
        if not any(folder.glob("*.safetensors")):
            raise InputError(
                f"--model {model}: {component}/ has no .safetensors weights; sagevideo loads "
                "safetensors only (re-save with save_pretrained(..., safe_serialization=True))"
            )
    return family.folder_source(path.resolve(), index, model)


def _loops(path: Path) -> bool:
    try:
        os.stat(path)
    except OSError as err:
        return err.errno == errno.ELOOP
    return False


def read_json(path: Path, where: str, fix: str) -> dict[str, Any]:
    if not path.is_file():
        raise InputError(f"{where}: {path.name} is missing in {path.parent}; {fix}")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise InputError(f"{where}: {path} is not readable JSON ({err}); {fix}") from None
    if not isinstance(data, dict):
        raise InputError(f"{where}: {path} is not a JSON object; {fix}")
    return data


def load_pipeline(source: ModelSource, device: str, dtype: Any):
    """Load the pipeline onto `device` in `dtype` (a torch.dtype) through its family, progress bars off."""
    pipe = source.model_family.load(source, device, dtype)
    # The batch has its own progress bar over jobs; per-step bars would interleave with it.
    pipe.set_progress_bar_config(disable=True)
    return pipe


@contextlib.contextmanager
def quiet_from_pretrained() -> Iterator[None]:
    """Around a folder's `from_pretrained` calls: diffusers' progress bar off (`no_diffusers_progress_bars`)
    and the FutureWarning diffusers 0.42 gives for `torch_dtype` ignored (it renamed the keyword
    `dtype`; older diffusers know only `torch_dtype`, so the loaders keep passing it)."""
    with warnings.catch_warnings(), no_diffusers_progress_bars():
        warnings.filterwarnings("ignore", message=".*torch_dtype.*deprecated", category=FutureWarning)
        yield


@contextlib.contextmanager
def no_diffusers_progress_bars() -> Iterator[None]:
    """diffusers' "Loading pipeline components" bar is process-wide; off while loading (it would cut
    through the batch's own bar, and Ray forwards every worker's copy), then as it was."""
    from diffusers.utils import logging as diffusers_logging

    was_enabled = diffusers_logging.is_progress_bar_enabled()
    diffusers_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            diffusers_logging.enable_progress_bar()
