"""The Open-Sora 2.0 model folder sagevideo loads: a diffusers-style folder, component by component.

    model_index.json        {"_class_name": "OpenSoraPipeline", ...}
    transformer/            config.json + *.safetensors   OpenSoraTransformer3DModel
    vae/                    config.json + *.safetensors   AutoencoderKLHunyuanVideo
    text_encoder/           config.json + *.safetensors   T5EncoderModel (T5-v1.1-XXL)
    tokenizer/              its tokenizer files           T5 tokenizer
    text_encoder_2/         config.json + *.safetensors   CLIPTextModel (ViT-L/14)
    tokenizer_2/            its tokenizer files           CLIP tokenizer
    scheduler/              scheduler_config.json         FlowMatchEulerDiscreteScheduler (shift 1)

`sagevideo convert-opensora OFFICIAL_DIR FOLDER` writes it from the official download
(`official.convert_official_folder`); `OpenSoraPipeline.save_pretrained(FOLDER)` writes the same
layout (the built-in tiny model's round trip). `check_folder` reads configs only and names every
missing or wrong part at once; `load_folder` loads each component with local files only and
safetensors only. Torch, diffusers and transformers are imported inside the functions that need them.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sagevideo.errors import InputError

CONVERT_HINT = "write one with `sagevideo convert-opensora OFFICIAL_DIR FOLDER` (see docs/opensora.md)"

# component -> (what it is, the class its config must name or None, the file that must be there)
COMPONENTS: dict[str, tuple[str, str | None, str]] = {
    "transformer": ("the Open-Sora 2.0 MMDiT", "OpenSoraTransformer3DModel", "config.json"),
    "vae": ("the HunyuanVideo VAE", "AutoencoderKLHunyuanVideo", "config.json"),
    "text_encoder": ("the T5 encoder", None, "config.json"),
    "tokenizer": ("the T5 tokenizer", None, "tokenizer_config.json"),
    "text_encoder_2": ("the CLIP text encoder", None, "config.json"),
    "tokenizer_2": ("the CLIP tokenizer", None, "tokenizer_config.json"),
    "scheduler": ("the flow-matching scheduler", "FlowMatchEulerDiscreteScheduler", "scheduler_config.json"),
}
WEIGHTED = ("transformer", "vae", "text_encoder", "text_encoder_2")
TEXT_ENCODER_TYPES = {"text_encoder": "t5", "text_encoder_2": ("clip_text_model", "clip")}


def check_folder(path: Path, where: str) -> dict[str, dict[str, Any]]:
    """{component: its config} of an Open-Sora folder; InputError naming every missing or wrong part."""
    configs: dict[str, dict[str, Any]] = {}
    problems = []
    for component, (what, cls, name) in COMPONENTS.items():
        folder = path / component
        file = folder / name
        if not folder.is_dir():
            problems.append(f"{component}/ ({what}) is missing")
            continue
        if not file.is_file():
            problems.append(f"{component}/{name} is missing ({what})")
            continue
        try:
            config = json.loads(file.read_text(encoding="utf-8"))
        except (OSError, ValueError) as err:
            problems.append(f"{component}/{name} is not readable JSON ({err})")
            continue
        if not isinstance(config, dict):
            problems.append(f"{component}/{name} is not a JSON object")
            continue
        if cls is not None and config.get("_class_name") != cls:
            problems.append(f"{component}/{name} names {config.get('_class_name')!r}, not {cls} ({what})")
        kind = TEXT_ENCODER_TYPES.get(component)
        if kind is not None and config.get("model_type") not in (kind if isinstance(kind, tuple) else (kind,)):
            problems.append(f"{component}/{name} is a {config.get('model_type')!r} model, not {what}")
        if component in WEIGHTED and not any(folder.glob("*.safetensors")):
            problems.append(f"{component}/ has no .safetensors weights (sagevideo loads safetensors only)")
        configs[component] = config
    if problems:
        raise InputError(f"{where}: not a complete Open-Sora 2.0 folder: " + "; ".join(problems) + f"; {CONVERT_HINT}")
    return configs


def looks_official(path: Path) -> str | None:
    """A hint when `path` is an official Open-Sora 2.0 download rather than a converted folder, else None."""
    from sagevideo.pipelines.opensora.official import OFFICIAL_TRANSFORMER

    if (path / OFFICIAL_TRANSFORMER).is_file():
        return (f"{path} is the official Open-Sora 2.0 download ({OFFICIAL_TRANSFORMER}); convert it once with "
                f"`sagevideo convert-opensora {path} FOLDER` and give --model FOLDER")
    return None


def load_folder(path: Path, device: str, dtype: Any):
    """The `OpenSoraPipeline` of a checked folder on `device` in `dtype` (local safetensors only)."""

    from diffusers import AutoencoderKLHunyuanVideo, FlowMatchEulerDiscreteScheduler
    from transformers import AutoTokenizer

    from sagevideo.pipelines.loading import quiet_from_pretrained
    from sagevideo.pipelines.opensora.pipeline import OpenSoraPipeline
    from sagevideo.pipelines.opensora.transformer import OpenSoraTransformer3DModel

    local = dict(local_files_only=True, use_safetensors=True)
    with quiet_from_pretrained(), quiet_transformers():
        transformer = OpenSoraTransformer3DModel.from_pretrained(path / "transformer", torch_dtype=dtype, **local)
        vae = AutoencoderKLHunyuanVideo.from_pretrained(path / "vae", torch_dtype=dtype, **local)
        text_encoder = load_text_encoder("T5EncoderModel", path / "text_encoder", dtype)
        text_encoder_2 = load_text_encoder("CLIPTextModel", path / "text_encoder_2", dtype)
        tokenizer = AutoTokenizer.from_pretrained(path / "tokenizer", local_files_only=True)
        tokenizer_2 = AutoTokenizer.from_pretrained(path / "tokenizer_2", local_files_only=True)
        scheduler = FlowMatchEulerDiscreteScheduler.from_pretrained(path / "scheduler", local_files_only=True)
    pipe = OpenSoraPipeline(
        tokenizer=tokenizer, text_encoder=text_encoder, tokenizer_2=tokenizer_2, text_encoder_2=text_encoder_2,
        vae=vae, transformer=transformer, scheduler=scheduler,
    )
    pipe.to(device)
    return pipe


def load_text_encoder(class_name: str, folder: Path, dtype: Any) -> Any:
    """A transformers text encoder (`T5EncoderModel`, `CLIPTextModel`) from a local folder, strictly:
    InputError naming the weights it lacks or has in another shape (transformers would leave them
    random with a warning). Weights it does not use (a T5 decoder, CLIP's vision tower) are fine."""
    import transformers

    cls = getattr(transformers, class_name)
    model, info = cls.from_pretrained(folder, local_files_only=True, use_safetensors=True, output_loading_info=True,
                                      **{transformers_dtype_keyword(): dtype})
    bad = [f"{len(keys)} {label}: {', '.join(map(str, list(keys)[:5]))}{', ...' if len(keys) > 5 else ''}"
           for label, keys in (("missing", info.get("missing_keys") or []),
                               ("wrong shape", info.get("mismatched_keys") or [])) if keys]
    if bad:
        raise InputError(f"{folder}: not a complete {class_name} ({'; '.join(bad)})")
    return model.eval()


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """transformers' progress bars and load reports off while loading or saving (each Ray worker
    would print them); `load_text_encoder` checks what the reports would say. Restored after."""
    from transformers.utils import logging as hf_logging

    bars, verbosity = hf_logging.is_progress_bar_enabled(), hf_logging.get_verbosity()
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()


def transformers_dtype_keyword() -> str:
    """transformers' from_pretrained dtype keyword: `dtype` from 4.56 (torch_dtype deprecated), else `torch_dtype`."""
    import transformers
    from packaging.version import Version

    return "dtype" if Version(transformers.__version__) >= Version("4.56") else "torch_dtype"
