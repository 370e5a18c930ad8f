"""Regional compile (`--compile regional`): each repeated block's own forward compiled, its inputs
made row-major outside the compiled code, and whether Inductor can generate code here."""

from __future__ import annotations

import importlib.util
import os
import shutil
from typing import Any


def inductor_problem(device: str) -> str | None:
    """Why torch.compile's Inductor backend cannot generate code for `device`, or None."""
    if device == "cuda":
        return None if importlib.util.find_spec("triton") is not None else "Inductor needs Triton on CUDA"
    cxx = os.environ.get("CXX") or next((c for c in ("g++", "clang++", "c++") if shutil.which(c)), None)
    if cxx is None or shutil.which(cxx) is None:
        return "Inductor on CPU needs a C++ compiler (g++ or clang++; $CXX) and none was found"
    return None


def compile_block_forwards(transformer: Any, blocks: list[tuple[str, Any]], backend: str,
                            applied: Any) -> None:
    """Each repeated block's own `forward` compiled (the blocks share its code, so one graph serves
    them), with `contiguous_inputs` as a forward pre-hook, outside the compiled code."""
    import torch

    declared = set(getattr(transformer, "_repeated_blocks", None) or ())
    if declared:
        modules = [m for m in transformer.modules() if type(m).__name__ in declared]
        applied.compile_via = "repeated blocks' forwards"
    else:
        modules = [block for _, block in blocks]
        applied.compile_via = "block forwards"
    if not modules:
        raise ValueError(f"--compile regional: {type(transformer).__name__} has no transformer block lists to compile")
    for block in modules:
        block.register_forward_pre_hook(contiguous_inputs, with_kwargs=True)
        block.forward = torch.compile(block.forward, backend=backend)
    applied.compiled_blocks += len(modules)


def contiguous_inputs(module: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """A block's tensor arguments copied to the default (row-major) strides where they have others.
    Dynamo guards on its inputs' strides: CogVideoX's first block gets the video part of the joint
    [text; video] sequence (a view whose rows are text + video tokens apart), the later blocks a
    fresh tensor, so the blocks compiled two graphs; one copy of the first block's inputs a step
    keeps them to one (half the compile, and half the warm start's tracing). `is_contiguous()` is
    not the test: with batch 1 that view is "contiguous" (a size-1 dim's stride is ignored there)
    and its batch stride still differs, which Dynamo guards on too."""
    import torch

    def dense(value: Any) -> Any:
        if not isinstance(value, torch.Tensor) or value.stride() == row_major_strides(value.shape):
            return value
        return value.clone(memory_format=torch.contiguous_format)

    return tuple(dense(a) for a in args), {k: dense(v) for k, v in kwargs.items()}


def row_major_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The strides torch gives a new tensor of `shape` (the last dim's 1; zero-size dims count as 1)."""
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))
