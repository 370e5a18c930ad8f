"""diffusers integration: the built-in tiny model, model loading, sagevideo's CogVideoX attention
processor and its `install`, and the single-job generation runner.

Modules, one job each:
- `tiny`: the built-in "tiny" CogVideoX pipeline (real architecture, fixed-seed weights, offline);
- `loading`: checks a model before loading (configs only), then loads it from local files;
- `cogvideox`: `SageCogVideoXAttnProcessor`, CogVideoX attention through `sagevideo.sageattn`;
- `install`: `install(pipe_or_transformer)` -> handle with `remove()`;
- `runner`: one job -> checked uint8 frames and timings;
- `opensora`: Open-Sora 2.0's transformer, official-checkpoint converter and text-to-video pipeline.

The Open-Sora names below load lazily: importing this package imports neither diffusers nor transformers.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "OpenSoraTransformer3DModel": "sagevideo.pipelines.opensora",
    "OpenSoraPipeline": "sagevideo.pipelines.opensora",
    "convert_official_state_dict": "sagevideo.pipelines.opensora",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
