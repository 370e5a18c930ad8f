"""Repository-level pytest set-up (loaded before any test module).

Without a GPU, the Triton kernels run under Triton's CPU interpreter; TRITON_INTERPRET must be
set before the kernels are decorated, i.e. before `sagevideo.kernels.quantize` is imported.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _patch_the_interpreters_language_once_per_launch() -> None:
    """Triton's interpreter patches the `triton.language` modules a kernel's globals name for each
    launch (`GridExecutor.__call__`, undone at its end), and again at every call of a @triton.jit
    helper inside the kernel (`InterpretedFunction.__call__`), walking the modules with
    inspect.getmembers each time: 40 % of an interpreted kernel's time in this suite. Within one
    launch a module patched once needs no second patch (its builtins are already replaced, and a
    helper's patch is never undone), so a helper's patch runs only for modules not yet patched in
    this launch (e.g. `triton.language.core`, which `tl.zeros`'s module names). A Triton whose
    interpreter lacks these names keeps its own behaviour."""
    import inspect

    from triton.runtime import interpreter

    patch_lang = getattr(interpreter, "_patch_lang", None)
    scope, executor = getattr(interpreter, "_LangPatchScope", None), getattr(interpreter, "GridExecutor", None)
    if patch_lang is None or scope is None or executor is None or getattr(patch_lang, "once_per_launch", False):
        return
    import triton.language as tl

    launch = {"active": False, "patched": set()}

    modules: dict[int, set[int]] = {}  # id(a function's globals) -> ids of the language modules they name

    def modules_of(fn) -> set[int]:
        found = modules.get(id(fn.__globals__))
        if found is None:
            found = modules[id(fn.__globals__)] = {
                id(value) for value in fn.__globals__.values() if inspect.ismodule(value) and value in (tl, tl.core)
            }
        return found

    def once_per_launch(fn):
        named = modules_of(fn)
        if launch["active"] and named and named <= launch["patched"]:
            return scope()
        patched = patch_lang(fn)
        if launch["active"]:
            launch["patched"] |= named
        return patched

    run_launch = executor.__call__

    def launch_call(self, *args, **kwargs):
        launch["active"], launch["patched"] = True, set()
        try:
            return run_launch(self, *args, **kwargs)
        finally:
            launch["active"], launch["patched"] = False, set()

    once_per_launch.once_per_launch = True
    interpreter._patch_lang = once_per_launch
    executor.__call__ = launch_call


if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
    _patch_the_interpreters_language_once_per_launch()


def pytest_collection_modifyitems(config, items):
    """Marks `kernels` every test parametrized with backend="triton" (it runs the Triton kernels, as the
    modules marked `kernels` do), and skips `gpu` tests without a GPU."""
    import pytest

    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is not None and callspec.params.get("backend") == "triton":
            item.add_marker(pytest.mark.kernels)
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU (run on the H200: pytest -m gpu)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)
