"""Open-Sora 2.0 in diffusers form: transformer, checkpoint converter, text- and image-to-video pipeline.

Modules, one job each:
- `rope`: 3D rotate-half RoPE tables and rotation; `embeddings`: timestep and MLP embedders;
- `layers`: QK-RMSNorm, adaLN modulation, feed-forward; `blocks`: double/single-stream blocks;
- `attention`: the attention module and its full-precision processor;
- `processor`: `SageOpenSoraAttnProcessor` (attention through `sagevideo.sageattn`), as CogVideoX's `processor`;
- `transformer`: `OpenSoraTransformer3DModel`; `convert`: official checkpoint -> this model;
- `packing`: pack/unpack and token positions; `schedule`: sigmas and guidance; `prompts`: the
  official prompt suffixes; `pipeline`: text-to-video and image-to-video from a first frame;
- `aspect`: the official aspect table; `tiny`: the built-in "tiny-opensora"; `folder`: the model
  folder layout, its check and loader; `official`: the official download -> that folder;
- `sequence_parallel`: Ulysses hooks; `family`: the family entry of `sagevideo.pipelines.families`.

Names load lazily, so importing this package does not import diffusers or transformers.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "OpenSoraTransformer3DModel": "transformer",
    "OpenSoraPipeline": "pipeline",
    "OpenSoraPipelineOutput": "pipeline",
    "convert_official_state_dict": "convert",
    "load_official_checkpoint": "convert",
    "ConversionReport": "convert",
    "CheckpointMismatchError": "convert",
    "OpenSoraAttention": "attention",
    "OpenSoraAttnProcessor": "attention",
    "SageOpenSoraAttnProcessor": "processor",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
