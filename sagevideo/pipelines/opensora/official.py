"""The official Open-Sora 2.0 download -> the diffusers-style folder sagevideo loads (`folder.py`).

The official release (`hpcai-tech/Open-Sora-v2`, fetched by the user; nothing is downloaded here)
is laid out as the official inference configs read it:

    OFFICIAL_DIR/Open_Sora_v2.safetensors          the MMDiT, official key names (OPENSORA.md §2)
    OFFICIAL_DIR/hunyuan_vae.safetensors           the HunyuanVideo VAE
    OFFICIAL_DIR/google/t5-v1_1-xxl/               a transformers T5 folder (config, tokenizer, weights)
    OFFICIAL_DIR/openai/clip-vit-large-patch14/    a transformers CLIP folder (config, tokenizer, weights)

Each path can be given on its own instead (`transformer=`, `vae=`, `t5=`, `clip=`).
`convert_official_folder` writes, component by component (one model in memory at a time):
- transformer/: `OpenSoraTransformer3DModel` (the released config) loaded through the key converter
  (`convert.load_official_checkpoint`: every missing, unexpected or mis-shaped key named), saved
  in shards of safetensors;
- vae/: `AutoencoderKLHunyuanVideo` (diffusers' defaults are the official config: 16 latent
  channels, 8x/4x, scaling 0.476986); the official VAE's module tree has diffusers' names, so its
  keys load as they are (strictly: a mismatch is named key by key);
- text_encoder/ + tokenizer/: the T5 encoder only (the decoder is not used), and its tokenizer;
- text_encoder_2/ + tokenizer_2/: CLIP's text tower only, and its tokenizer;
- scheduler/: `FlowMatchEulerDiscreteScheduler()` (shift 1: the pipeline applies Open-Sora's own);
- model_index.json, last, naming `OpenSoraPipeline`.
The folder is written under `<out>.partial` and renamed into place when complete, so an
interrupted conversion never leaves a folder that looks whole.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from sagevideo.errors import InputError
from sagevideo.pipelines.opensora.folder import quiet_transformers

OFFICIAL_TRANSFORMER = "Open_Sora_v2.safetensors"
OFFICIAL_VAE = "hunyuan_vae.safetensors"
OFFICIAL_T5 = Path("google") / "t5-v1_1-xxl"
OFFICIAL_CLIP = Path("openai") / "clip-vit-large-patch14"
DTYPES = ("bfloat16", "float32", "float16")
DType = Literal["bfloat16", "float32", "float16"]


class ConvertOpenSoraConfig(BaseModel):
    """Every option of `sagevideo convert-opensora SRC DST` (`convert_opensora`), in the CLI's order."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    source: Path = Field(description="SRC: the official Open-Sora 2.0 download (hpcai-tech/Open-Sora-v2: "
                         f"{OFFICIAL_TRANSFORMER}, {OFFICIAL_VAE}, {OFFICIAL_T5.as_posix()}/, "
                         f"{OFFICIAL_CLIP.as_posix()}/).")
    out: Path = Field(description="DST: the diffusers-style folder to write (new or empty); give it as --model.")
    transformer: Path | None = Field(None, description=f"The MMDiT safetensors (default: SRC/{OFFICIAL_TRANSFORMER}).")
    vae: Path | None = Field(None, description=f"The HunyuanVideo VAE safetensors (default: SRC/{OFFICIAL_VAE}).")
    t5: Path | None = Field(None, description=f"The T5-v1.1-XXL folder (default: SRC/{OFFICIAL_T5.as_posix()}).")
    clip: Path | None = Field(None, description=f"The CLIP ViT-L/14 folder (default: SRC/{OFFICIAL_CLIP.as_posix()}).")
    dtype: DType = Field("bfloat16", description="What the weights are stored in (the release is bfloat16).")
    max_shard_size: str = Field("10GB", description="Largest safetensors shard, e.g. 10GB or 500MB.")

    @classmethod
    def build(cls, **options: Any) -> ConvertOpenSoraConfig:
        """A config from keyword options; InputError naming every bad option at once."""
        from sagevideo.jobs.problems import options_error

        try:
            return cls(**options)
        except ValidationError as err:
            raise options_error(err) from None


def convert_opensora(config: ConvertOpenSoraConfig | None = None, /, log: Callable[[str], None] = lambda line: None,
                     **options: Any) -> Path:
    """Convert the official download `config.source` into the folder `config.out` (see
    `convert_official_folder`); options: `ConvertOpenSoraConfig`'s fields, instead of or over a config."""
    if config is None:
        config = ConvertOpenSoraConfig.build(**options)
    elif options:
        config = ConvertOpenSoraConfig.build(**{**dict(config), **options})
    return convert_official_folder(
        config.source, config.out, transformer=config.transformer, vae=config.vae, t5=config.t5, clip=config.clip,
        dtype=config.dtype, max_shard_size=config.max_shard_size, log=log,
    )


@dataclass(frozen=True)
class OfficialLayout:
    """Where each official part is: two safetensors files and two transformers folders."""

    transformer: Path
    vae: Path
    t5: Path
    clip: Path


def find_official(root: Path | str | None, *, transformer: Path | str | None = None, vae: Path | str | None = None,
                  t5: Path | str | None = None, clip: Path | str | None = None) -> OfficialLayout:
    """The official parts under `root` (or as given); InputError naming every part that is missing."""
    base = Path(root).expanduser() if root is not None else None
    if base is not None and not base.is_dir():
        raise InputError(f"{root}: no such folder; give the official Open-Sora 2.0 download (see docs/opensora.md)")

    def place(given, default) -> Path | None:
        if given is not None:
            return Path(given).expanduser()
        return base / default if base is not None else None

    parts = {
        "transformer": (place(transformer, OFFICIAL_TRANSFORMER), "file", "the MMDiT checkpoint", "--transformer"),
        "vae": (place(vae, OFFICIAL_VAE), "file", "the HunyuanVideo VAE checkpoint", "--vae"),
        "t5": (place(t5, OFFICIAL_T5), "dir", "the T5-v1.1-XXL folder (transformers format)", "--t5"),
        "clip": (place(clip, OFFICIAL_CLIP), "dir", "the CLIP ViT-L/14 folder (transformers format)", "--clip"),
    }
    problems, found = [], {}
    for name, (path, kind, what, option) in parts.items():
        if path is None:
            problems.append(f"{what}: give {option} (or the official folder)")
        elif kind == "file" and not path.is_file():
            problems.append(f"{what}: {path} is missing")
        elif kind == "file" and path.suffix != ".safetensors":
            problems.append(f"{what}: {path} is not a .safetensors file (no pickle checkpoints)")
        elif kind == "dir" and not (path / "config.json").is_file():
            problems.append(f"{what}: {path / 'config.json'} is missing")
        else:
            found[name] = path
    if problems:
        raise InputError("the official Open-Sora 2.0 parts are incomplete: " + "; ".join(problems)
                         + " (nothing is downloaded: fetch hpcai-tech/Open-Sora-v2 yourself, see docs/opensora.md)")
    return OfficialLayout(**found)


def convert_official_folder(
    root: Path | str | None,
    out: Path | str,
    *,
    transformer: Path | str | None = None,
    vae: Path | str | None = None,
    t5: Path | str | None = None,
    clip: Path | str | None = None,
    dtype: str = "bfloat16",
    transformer_config: Mapping[str, Any] | None = None,
    vae_config: Mapping[str, Any] | None = None,
    max_shard_size: str = "10GB",
    log: Callable[[str], None] = lambda line: None,
) -> Path:
    """Write the diffusers-style Open-Sora 2.0 folder `out` from the official parts; returns its path.

    dtype: what the weights are stored in ("bfloat16", the released checkpoint's and the GPU
    runs' dtype; "float32"; "float16"). transformer_config / vae_config: the models' configs
    (default: the released ones; the tests convert tiny synthetic checkpoints). log: one line per
    component. Raises InputError for missing parts, an `out` that exists and is not empty, or a
    checkpoint that does not fit (naming its missing, unexpected and mis-shaped keys).
    """
    import torch

    if dtype not in DTYPES:
        raise InputError(f"--dtype {dtype}: use one of {', '.join(DTYPES)}")
    layout = find_official(root, transformer=transformer, vae=vae, t5=t5, clip=clip)
    target = Path(out).expanduser()
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise InputError(f"{out}: exists and is not an empty folder; give a new (or empty) folder to write")
    partial = target.with_name(target.name + ".partial")
    if partial.exists():
        shutil.rmtree(partial)  # a conversion that was interrupted: start again
    partial.mkdir(parents=True)
    try:
        with quiet_transformers():
            _write_components(layout, partial, getattr(torch, dtype), transformer_config, vae_config,
                              max_shard_size, log)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)  # nothing half-written stays behind
        raise
    if target.exists():
        target.rmdir()  # empty (checked above)
    partial.rename(target)
    log(f"wrote {target}")
    return target


def _write_components(layout: OfficialLayout, partial: Path, torch_dtype, transformer_config, vae_config,
                      max_shard_size: str, log: Callable[[str], None]) -> None:
    """Every component into `partial`, then model_index.json (last: a folder with it is complete)."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    classes = {}
    log(f"transformer: {layout.transformer}")
    classes["transformer"] = _convert_transformer(layout.transformer, partial / "transformer", torch_dtype,
                                                  transformer_config, max_shard_size)
    log(f"vae: {layout.vae}")
    classes["vae"] = _convert_vae(layout.vae, partial / "vae", torch_dtype, vae_config)
    log(f"text_encoder, tokenizer: {layout.t5}")
    classes["text_encoder"], classes["tokenizer"] = _convert_text(
        layout.t5, partial, "text_encoder", "tokenizer", "T5EncoderModel", torch_dtype, max_shard_size)
    log(f"text_encoder_2, tokenizer_2: {layout.clip}")
    classes["text_encoder_2"], classes["tokenizer_2"] = _convert_text(
        layout.clip, partial, "text_encoder_2", "tokenizer_2", "CLIPTextModel", torch_dtype, max_shard_size)
    FlowMatchEulerDiscreteScheduler().save_pretrained(partial / "scheduler")
    classes["scheduler"] = ("diffusers", "FlowMatchEulerDiscreteScheduler")
    _write_model_index(partial, classes)


def _convert_transformer(file: Path, out: Path, dtype, config, max_shard_size) -> tuple[str, str]:
    import torch

    from sagevideo.pipelines.opensora.convert import CheckpointMismatchError, load_official_checkpoint
    from sagevideo.pipelines.opensora.transformer import OpenSoraTransformer3DModel

    with torch.device("meta"):  # the released config: no 48 GB fp32 random init
        model = OpenSoraTransformer3DModel(**(dict(config) if config else {}))
    try:
        load_official_checkpoint(model, file)
    except CheckpointMismatchError as err:  # names the missing, unexpected and mis-shaped keys
        raise InputError(f"{err}; is it the official {OFFICIAL_TRANSFORMER}?") from None
    # torch's own `to`: diffusers' ModelMixin.to warns about fp32 modules on every cast (there are none)
    torch.nn.Module.to(model, dtype)
    model.save_pretrained(out, safe_serialization=True, max_shard_size=max_shard_size)
    del model
    return (OpenSoraTransformer3DModel.__module__, OpenSoraTransformer3DModel.__name__)


def _convert_vae(file: Path, out: Path, dtype, config) -> tuple[str, str]:
    import torch
    from diffusers import AutoencoderKLHunyuanVideo
    from safetensors.torch import load_file

    vae = AutoencoderKLHunyuanVideo(**(dict(config) if config else {}))
    state = load_file(str(file), device="cpu")
    expected = vae.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    shapes = sorted(f"{k}: expected {tuple(expected[k].shape)}, got {tuple(state[k].shape)}"
                    for k in set(state) & set(expected) if tuple(state[k].shape) != tuple(expected[k].shape))
    if missing or unexpected or shapes:
        found = "; ".join(f"{len(keys)} {label}: {', '.join(keys[:8])}{', ...' if len(keys) > 8 else ''}"
                          for label, keys in (("missing", missing), ("unexpected", unexpected),
                                              ("wrong shape", shapes)) if keys)
        raise InputError(f"{file} does not match diffusers' AutoencoderKLHunyuanVideo ({found}); "
                         "is it the official hunyuan_vae.safetensors?")
    vae.load_state_dict(state, strict=True)
    torch.nn.Module.to(vae, dtype)
    vae.save_pretrained(out, safe_serialization=True)
    return ("diffusers", "AutoencoderKLHunyuanVideo")


def _convert_text(folder: Path, out: Path, model_dir: str, tokenizer_dir: str, cls_name: str, dtype,
                  max_shard_size) -> tuple[tuple[str, str], tuple[str, str]]:
    """A transformers T5/CLIP folder -> its text encoder (only) and tokenizer."""
    from transformers import AutoTokenizer

    from sagevideo.pipelines.opensora.folder import load_text_encoder

    try:
        model = load_text_encoder(cls_name, folder, dtype)
        tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    except (OSError, ValueError) as err:
        raise InputError(f"{folder}: cannot be read as a {cls_name} with its tokenizer ({err})") from None
    model.save_pretrained(out / model_dir, safe_serialization=True, max_shard_size=max_shard_size)
    tokenizer.save_pretrained(out / tokenizer_dir)
    return ("transformers", cls_name), ("transformers", type(tokenizer).__name__)


def _write_model_index(folder: Path, classes: dict[str, tuple[str, str]]) -> None:
    """model_index.json as `DiffusionPipeline.save_pretrained` writes it for an OpenSoraPipeline."""
    import diffusers

    index = {"_class_name": "OpenSoraPipeline", "_diffusers_version": diffusers.__version__}
    index.update({name: list(classes[name]) for name in sorted(classes)})
    (folder / "model_index.json").write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")
