"""diffusers integration: the built-in tiny model, model loading, sagevideo's CogVideoX attention
processor and its `install`, and the single-job generation runner.

Modules, one job each:
- `tiny`: the built-in "tiny" CogVideoX pipeline (real architecture, fixed-seed weights, offline);
- `loading`: checks a model before loading (configs only), then loads it from local files;
- `cogvideox`: `SageCogVideoXAttnProcessor`, CogVideoX attention through `sagevideo.sageattn`;
- `install`: `install(pipe_or_transformer)` -> handle with `remove()`;
- `runner`: one job -> checked uint8 frames and timings.
"""
