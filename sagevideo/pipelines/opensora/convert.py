"""Official Open-Sora 2.0 checkpoint -> `OpenSoraTransformer3DModel` state dict.

The released `Open_Sora_v2.safetensors` stores the official module names (OPENSORA.md §2 in the
project notes): `img_in`, `double_blocks.{i}.img_attn.q_proj`, `single_blocks.{j}.v_mlp`, ...
`convert_official_state_dict` renames them to this port's names and splits each single block's
`v_mlp` (rows 0:C = v, rows C: = MLP-in). It never guesses: the official keys a config must have
are listed from the config, and the report names every missing, unexpected or mis-shaped key.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

# Released Open_Sora_v2 config (the model class defaults), used when no config is given.
RELEASED_CONFIG = dict(
    in_channels=64, vec_in_dim=768, context_in_dim=4096, hidden_size=3072, num_heads=24, depth=19,
    depth_single_blocks=38, mlp_ratio=4.0, cond_embed=True, cond_in_channels=68,
)

# official module -> ours; every entry has .weight and .bias
_TOP = {
    "img_in": "x_embedder",
    "time_in.in_layer": "time_embed.linear_1",
    "time_in.out_layer": "time_embed.linear_2",
    "vector_in.in_layer": "pooled_text_embed.linear_1",
    "vector_in.out_layer": "pooled_text_embed.linear_2",
    "cond_in": "cond_embedder",
    "txt_in": "context_embedder",
    "final_layer.adaLN_modulation.1": "norm_out.linear",  # rows: shift, scale (kept in that order)
    "final_layer.linear": "proj_out",
}
_DOUBLE = {
    "img_mod.lin": "img_mod.linear",
    "txt_mod.lin": "txt_mod.linear",
    "img_attn.q_proj": "attn.to_q",
    "img_attn.k_proj": "attn.to_k",
    "img_attn.v_proj": "attn.to_v",
    "img_attn.proj": "attn.to_out",
    "txt_attn.q_proj": "attn.add_q_proj",
    "txt_attn.k_proj": "attn.add_k_proj",
    "txt_attn.v_proj": "attn.add_v_proj",
    "txt_attn.proj": "attn.to_add_out",
    "img_mlp.0": "ff.fc_in",
    "img_mlp.2": "ff.fc_out",
    "txt_mlp.0": "ff_context.fc_in",
    "txt_mlp.2": "ff_context.fc_out",
}
_DOUBLE_NORMS = {  # official parameter -> ours (RMSNorm `scale` -> `weight`)
    "img_attn.norm.query_norm.scale": "attn.norm_q.weight",
    "img_attn.norm.key_norm.scale": "attn.norm_k.weight",
    "txt_attn.norm.query_norm.scale": "attn.norm_added_q.weight",
    "txt_attn.norm.key_norm.scale": "attn.norm_added_k.weight",
}
_SINGLE = {
    "modulation.lin": "mod.linear",
    "q_proj": "attn.to_q",
    "k_proj": "attn.to_k",
    "linear2": "proj_out",
}
_SINGLE_NORMS = {
    "norm.query_norm.scale": "attn.norm_q.weight",
    "norm.key_norm.scale": "attn.norm_k.weight",
}
_V_MLP = "v_mlp"  # split: rows [:C] -> attn.to_v, rows [C:] -> proj_mlp
_BLOCK = re.compile(r"^(double_blocks|single_blocks)\.(\d+)\.(.+)$")


@dataclass(frozen=True)
class ConversionReport:
    """What did not line up, by official key name (empty tuples: a clean conversion).

    missing: keys the config needs that the checkpoint lacks; unexpected: checkpoint keys the
    config does not have (renamed models, extra blocks, guidance_in of FLUX.1-dev, ...);
    mismatched: "key: expected (..), got (..)" for keys whose shape differs from the config's.
    """

    missing: tuple[str, ...] = ()
    unexpected: tuple[str, ...] = ()
    mismatched: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not (self.missing or self.unexpected or self.mismatched)

    def describe(self, limit: int = 20) -> str:
        if self.ok:
            return "all official keys present, none unexpected, all shapes as configured"
        parts = []
        for label, names in (("missing", self.missing), ("unexpected", self.unexpected),
                             ("wrong shape", self.mismatched)):
            if names:
                shown = ", ".join(names[:limit]) + (f", ... ({len(names) - limit} more)" if len(names) > limit else "")
                parts.append(f"{len(names)} {label}: {shown}")
        return "; ".join(parts)


class CheckpointMismatchError(ValueError):
    """The checkpoint does not match the model's config; `.report` names the keys."""

    def __init__(self, message: str, report: ConversionReport):
        super().__init__(message)
        self.report = report


def official_key_shapes(config: Mapping[str, Any] | None = None) -> dict[str, tuple[int, ...]]:
    """Every official key of a model with this config, with its shape (OPENSORA.md §2)."""
    cfg = {**RELEASED_CONFIG, **({k: v for k, v in dict(config).items() if k in RELEASED_CONFIG} if config else {})}
    c, h = cfg["hidden_size"], int(cfg["hidden_size"] * cfg["mlp_ratio"])
    head_dim = c // cfg["num_heads"]

    def linear(name: str, out_f: int, in_f: int) -> dict[str, tuple[int, ...]]:
        return {f"{name}.weight": (out_f, in_f), f"{name}.bias": (out_f,)}

    shapes: dict[str, tuple[int, ...]] = {}
    shapes |= linear("img_in", c, cfg["in_channels"])
    shapes |= linear("time_in.in_layer", c, 256) | linear("time_in.out_layer", c, c)
    shapes |= linear("vector_in.in_layer", c, cfg["vec_in_dim"]) | linear("vector_in.out_layer", c, c)
    if cfg["cond_embed"]:
        shapes |= linear("cond_in", c, cfg["cond_in_channels"])
    shapes |= linear("txt_in", c, cfg["context_in_dim"])
    for i in range(cfg["depth"]):
        p = f"double_blocks.{i}"
        for s in ("img", "txt"):
            shapes |= linear(f"{p}.{s}_mod.lin", 6 * c, c)
            for proj in ("q_proj", "k_proj", "v_proj", "proj"):
                shapes |= linear(f"{p}.{s}_attn.{proj}", c, c)
            for norm in ("query_norm", "key_norm"):
                shapes[f"{p}.{s}_attn.norm.{norm}.scale"] = (head_dim,)
            shapes |= linear(f"{p}.{s}_mlp.0", h, c) | linear(f"{p}.{s}_mlp.2", c, h)
    for j in range(cfg["depth_single_blocks"]):
        p = f"single_blocks.{j}"
        shapes |= linear(f"{p}.q_proj", c, c) | linear(f"{p}.k_proj", c, c)
        shapes |= linear(f"{p}.v_mlp", c + h, c) | linear(f"{p}.linear2", c, c + h)
        for norm in ("query_norm", "key_norm"):
            shapes[f"{p}.norm.{norm}.scale"] = (head_dim,)
        shapes |= linear(f"{p}.modulation.lin", 3 * c, c)
    shapes |= linear("final_layer.linear", cfg["in_channels"], c)
    shapes |= linear("final_layer.adaLN_modulation.1", 2 * c, c)
    return shapes


def convert_official_state_dict(
    state_dict: Mapping[str, torch.Tensor], config: Mapping[str, Any] | None = None
) -> tuple[dict[str, torch.Tensor], ConversionReport]:
    """Rename an official state dict to `OpenSoraTransformer3DModel`'s names.

    state_dict: official key -> tensor (e.g. `safetensors.torch.load_file(path)`).
    config: the target model's config (`model.config` or a dict); None = the released config.
    Returns (converted, report). Only keys that are expected and correctly shaped are converted;
    the split `v_mlp` halves are views of the original tensor (no copy).
    """
    expected = official_key_shapes(config)
    hidden = (dict(config) if config else RELEASED_CONFIG).get("hidden_size", RELEASED_CONFIG["hidden_size"])
    converted: dict[str, torch.Tensor] = {}
    unexpected, mismatched = [], []
    for key, tensor in state_dict.items():
        if key not in expected:
            unexpected.append(key)
            continue
        if tuple(tensor.shape) != expected[key]:
            mismatched.append(f"{key}: expected {expected[key]}, got {tuple(tensor.shape)}")
            continue
        for name, value in _rename(key, tensor, hidden):
            converted[name] = value
    missing = sorted(set(expected) - set(state_dict))
    report = ConversionReport(tuple(missing), tuple(sorted(unexpected)), tuple(sorted(mismatched)))
    return converted, report


def _rename(key: str, tensor: torch.Tensor, hidden: int) -> list[tuple[str, torch.Tensor]]:
    """One official (key, tensor) -> [(our key, tensor)], two entries for a v_mlp split."""
    module, _, param = key.rpartition(".")
    if module in _TOP:
        return [(f"{_TOP[module]}.{param}", tensor)]
    match = _BLOCK.match(key)
    if match is None:
        raise KeyError(f"no mapping for official key {key!r}")  # official_key_shapes and the tables disagree
    kind, index, rest = match.groups()
    if kind == "double_blocks":
        prefix, modules, norms = f"transformer_blocks.{index}", _DOUBLE, _DOUBLE_NORMS
    else:
        prefix, modules, norms = f"single_transformer_blocks.{index}", _SINGLE, _SINGLE_NORMS
    if rest in norms:
        return [(f"{prefix}.{norms[rest]}", tensor)]
    module, _, param = rest.rpartition(".")
    if kind == "single_blocks" and module == _V_MLP:
        return [(f"{prefix}.attn.to_v.{param}", tensor[:hidden]), (f"{prefix}.proj_mlp.{param}", tensor[hidden:])]
    return [(f"{prefix}.{modules[module]}.{param}", tensor)]


def load_official_checkpoint(model: torch.nn.Module, path: str | Path) -> ConversionReport:
    """Load an official safetensors checkpoint (a file, or a local folder of .safetensors shards) into `model`.

    Local files only, safetensors only. Raises FileNotFoundError / ValueError for a bad path and
    CheckpointMismatchError naming the missing, unexpected and mis-shaped official keys when the
    checkpoint does not match `model.config`; nothing is loaded then.
    A model built on the meta device (`with torch.device("meta"): OpenSoraTransformer3DModel()`,
    no 48 GB fp32 init for the released size) takes the checkpoint's tensors as they are, in the
    checkpoint's dtype; otherwise `load_state_dict` copies them into the existing parameters.
    """
    from safetensors.torch import load_file

    files = _checkpoint_files(Path(path).expanduser())
    state_dict: dict[str, torch.Tensor] = {}
    for file in files:
        shard = load_file(str(file), device="cpu")
        clash = sorted(set(shard) & set(state_dict))
        if clash:
            raise ValueError(f"{file}: keys also present in another shard: {', '.join(clash[:5])}")
        state_dict |= shard
    converted, report = convert_official_state_dict(state_dict, model.config)
    if not report.ok:
        raise CheckpointMismatchError(
            f"{path} does not match the model config (official key names): {report.describe()}", report
        )
    assign = any(p.is_meta for p in model.parameters())
    if assign:
        # The v_mlp halves are views of one tensor; as parameters they must own their storage
        # (safetensors refuses to save tensors that share memory).
        converted = {k: v.clone() if _is_v_mlp_part(k) else v for k, v in converted.items()}
    # strict: a key the converter produces that the model lacks (or vice versa) is a converter bug.
    model.load_state_dict(converted, strict=True, assign=assign)
    return report


def _is_v_mlp_part(name: str) -> bool:
    return name.startswith("single_transformer_blocks.") and (".attn.to_v." in name or ".proj_mlp." in name)


def _checkpoint_files(path: Path) -> list[Path]:
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file or folder (checkpoints load from local paths only)")
    files = sorted(path.glob("*.safetensors")) if path.is_dir() else [path]
    if not files:
        raise ValueError(f"{path}: folder holds no .safetensors files")
    for file in files:
        if file.suffix != ".safetensors":
            raise ValueError(f"{file}: only .safetensors checkpoints are loaded (no pickle files)")
    return files
