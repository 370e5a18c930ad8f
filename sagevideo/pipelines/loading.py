"""Model sources: check a model before loading it, then load it (local files only).

`resolve_model("tiny" | path)` reads only JSON configs, so every problem (missing folder, no
model_index.json, unsupported pipeline, missing safetensors, a video size the model cannot
make) is reported before any weights are read. `load_pipeline` then builds the tiny model or
calls `CogVideoXPipeline.from_pretrained(path, local_files_only=True, use_safetensors=True)`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sagevideo.jobs.specs import InputError, JobSpec

SUPPORTED_PIPELINES = ("CogVideoXPipeline",)
_WEIGHT_COMPONENTS = ("transformer", "vae", "text_encoder")


@dataclass(frozen=True)
class ModelSource:
    """A model that passed the pre-load checks, with what jobs need to know about it.

    name: "tiny" or the absolute folder path. fingerprint: 12 hex digits that change when the
    model does (tiny: its configs and seed; a folder: its configs and weight file sizes), so
    outputs of an older model are not taken as done. spatial/temporal: VAE compression factors;
    patch: transformer patch size (height and width must be multiples of spatial*patch).
    layers: number of transformer blocks (one attention layer each, named as `attention_layers`).
    vae_channels: channels of the VAE decoder at full resolution (what its memory scales with).
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

    @property
    def is_tiny(self) -> bool:
        return self.path is None

    @property
    def attention_layers(self) -> list[str]:
        """Names of the transformer's attention layers, as plans and `install` name them, from the
        config alone (CogVideoX: one `attn1` per block)."""
        return [f"transformer_blocks.{i}.attn1" for i in range(self.layers)]

    def resolve(self, job: JobSpec) -> JobSpec:
        """The job with unset size/steps filled from this model's defaults."""
        return job.model_copy(
            update={
                "height": job.height or self.default_height,
                "width": job.width or self.default_width,
                "frames": job.frames or self.default_frames,
                "steps": job.steps or self.default_steps,
            }
        )

    def problems(self, job: JobSpec) -> list[str]:
        """Why this model cannot make a resolved job ('<field>: <problem>; use e.g. ...'), or []."""
        size = self.spatial * self.patch
        problems = []
        for field in ("height", "width"):
            value = getattr(job, field)
            if value % size:
                lower = value // size * size
                near = f"{lower} or {lower + size}" if lower else f"{size}"
                problems.append(
                    f"{field}: {value} px is not a multiple of {size} "
                    f"(VAE {self.spatial}x times patch {self.patch}); use e.g. {near}"
                )
        # Latent frames must be odd as well: CogVideoX's VAE decodes latent frames in pairs and turns
        # an even count L into temporal·L frames (5 frames -> 2 latent -> 8 decoded), not 1 + temporal·(L-1).
        step = 2 * self.temporal
        if (job.frames - 1) % step:
            near = (job.frames - 1) // step * step + 1
            latent = (job.frames - 1) // self.temporal + 1
            why = (
                f"is not 1 + a multiple of {self.temporal} (the VAE compresses time {self.temporal}x)"
                if (job.frames - 1) % self.temporal
                else f"makes {latent} latent frames, and the VAE decodes an even number of latent frames into "
                f"{self.temporal * latent} frames, not {job.frames}"
            )
            problems.append(f"frames: {job.frames} {why}; use 1 + a multiple of {step}, e.g. {near} or {near + step}")
        return problems


def resolve_model(model: str) -> ModelSource:
    """Check "tiny" or a local diffusers folder without loading weights."""
    if model == "tiny":
        from sagevideo.pipelines import tiny

        cfg, vae = tiny.TRANSFORMER_CONFIG, tiny.VAE_CONFIG
        return ModelSource(
            name="tiny",
            path=None,
            fingerprint=_fingerprint(
                [cfg, vae, tiny.T5_CONFIG, tiny.TINY_SEED, tiny.DEFAULT_HEIGHT, tiny.DEFAULT_FRAMES]
            ),
            pipeline_class="CogVideoXPipeline",
            heads=cfg["num_attention_heads"],
            head_dim=cfg["attention_head_dim"],
            spatial=2 ** (len(vae["block_out_channels"]) - 1),
            temporal=vae["temporal_compression_ratio"],
            patch=cfg["patch_size"],
            text_tokens=cfg["max_text_seq_length"],
            default_height=tiny.DEFAULT_HEIGHT,
            default_width=tiny.DEFAULT_WIDTH,
            default_frames=tiny.DEFAULT_FRAMES,
            default_steps=2,
            layers=cfg["num_layers"],
            vae_channels=vae["block_out_channels"][0],
        )
    path = Path(model).expanduser()
    if not path.exists():
        raise InputError(
            f"--model {model}: no such folder; give 'tiny' or a local diffusers folder "
            "(nothing is downloaded)"
        )
    if not path.is_dir():
        raise InputError(f"--model {model}: is a file; give the diffusers folder that holds model_index.json")
    index = _read_json(
        path / "model_index.json",
        f"--model {model}",
        "give the diffusers folder that holds model_index.json (a save_pretrained output)",
    )
    cls = index.get("_class_name")
    if cls not in SUPPORTED_PIPELINES:
        raise InputError(
            f"--model {model}: model_index.json names {cls!r}; sagevideo generate runs "
            f"{', '.join(SUPPORTED_PIPELINES)}"
        )
    for component in _WEIGHT_COMPONENTS:
        folder = path / component
        if not any(folder.glob("*.safetensors")):
            raise InputError(
                f"--model {model}: {component}/ has no .safetensors weights; sagevideo loads "
                "safetensors only (re-save with save_pretrained(..., safe_serialization=True))"
            )
    cfg = _read_json(
        path / "transformer" / "config.json", f"--model {model}", "the transformer/ folder is incomplete"
    )
    vae = _read_json(path / "vae" / "config.json", f"--model {model}", "the vae/ folder is incomplete")
    spatial = 2 ** (len(vae.get("block_out_channels", (0,) * 4)) - 1)
    return ModelSource(
        name=str(path.resolve()),
        path=path.resolve(),
        fingerprint=_folder_fingerprint(path),
        pipeline_class=cls,
        heads=cfg.get("num_attention_heads", 30),
        head_dim=cfg.get("attention_head_dim", 64),
        spatial=spatial,
        temporal=vae.get("temporal_compression_ratio", 4),
        patch=cfg.get("patch_size", 2),
        text_tokens=cfg.get("max_text_seq_length", 226),
        default_height=cfg.get("sample_height", 60) * spatial,
        default_width=cfg.get("sample_width", 90) * spatial,
        default_frames=cfg.get("sample_frames", 49),
        default_steps=50,
        layers=cfg.get("num_layers", 30),
        vae_channels=(vae.get("block_out_channels") or (128,))[0],
    )


def _fingerprint(parts: list[Any]) -> str:
    payload = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()[:12]


def _folder_fingerprint(path: Path) -> str:
    """Configs' contents and weight files' sizes (not mtimes: a copied folder is the same model)."""
    parts = []
    for file in sorted(path.rglob("*")):
        rel = file.relative_to(path).as_posix()
        if file.suffix == ".json" and file.is_file():
            parts.append([rel, file.read_text(encoding="utf-8", errors="replace")])
        elif file.suffix == ".safetensors":
            parts.append([rel, file.stat().st_size])
    return _fingerprint(parts)


def _read_json(path: Path, where: str, fix: str) -> dict[str, Any]:
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
    """Load the pipeline onto `device` in `dtype` (a torch.dtype), progress bars off."""
    if source.is_tiny:
        import torch

        from sagevideo.pipelines.tiny import tiny_pipeline

        pipe = tiny_pipeline()
        for module in (pipe.transformer, pipe.vae, pipe.text_encoder):
            # torch's own `to`: diffusers' ModelMixin.to warns about fp32 modules on every dtype
            # cast, even with none to keep (diffusers 0.42); the tiny models have none.
            torch.nn.Module.to(module, device=device, dtype=dtype)
    else:
        import warnings

        from diffusers import CogVideoXPipeline

        with warnings.catch_warnings(), _no_diffusers_progress_bars():
            # diffusers 0.42 renamed torch_dtype to dtype (FutureWarning); older ones know only torch_dtype.
            warnings.filterwarnings("ignore", message=".*torch_dtype.*deprecated", category=FutureWarning)
            pipe = CogVideoXPipeline.from_pretrained(
                source.path, local_files_only=True, use_safetensors=True, torch_dtype=dtype
            )
        pipe.to(device)
    # The batch has its own progress bar over jobs; per-step bars would interleave with it.
    pipe.set_progress_bar_config(disable=True)
    return pipe


@contextlib.contextmanager
def _no_diffusers_progress_bars() -> Iterator[None]:
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
