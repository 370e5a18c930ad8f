"""diffusers integration: model families, model loading, sagevideo's attention processors and
their `install`, and the single-job generation runner.

Modules, one job each:
- `families`: the registry table of model families (one folder each, below) and what the rest of
  sagevideo asks of a family: detection, loading, job constraints, attention routes, sequence
  parallelism;
- `loading`: checks a model before loading (configs only), then has its family load it from local files;
- `install`: `install(pipe_or_transformer)` -> handle with `remove()`;
- `runner`: one job -> checked uint8 frames and timings (the family's denoise and decode inside);
- `tiny`: what every family's built-in tiny model shares (a byte-level tokenizer);
- `cogvideox`: the CogVideoX family: `family`, the built-in "tiny" model, `SageCogVideoXAttnProcessor`,
  Ulysses sequence parallelism, `noise_first` (CogVideoX-5B's DPM scheduler with its step noise
  drawn while the GPU runs the forward);
- `opensora`: the Open-Sora 2.0 family: its transformer, official-checkpoint converter, text-to-video
  pipeline, attention processors and Ulysses hooks;
- `wan`, `hunyuanvideo`: the Wan 2.1/2.2 and HunyuanVideo families (diffusers' attention
  dispatcher models): `family`, their tiny models, Ulysses sequence parallelism (HunyuanVideo's
  prompt templates too).
Beside the families: `recipe` (FP8 linears, regional compile, step caches), `intercept` and
`routing` (sagevideo attention inside dispatcher models), `plans`, `calibrate`, `forwards`.

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
