"""What `sagevideo env` prints: versions, devices, the attention backends and kernel plans
(`sagevideo.attention.environment`), the speed recipe this machine can run
(`sagevideo.pipelines.recipe.capabilities`) and whether workers find their imports byte-compiled."""

from __future__ import annotations

import importlib.util
import os
import platform
import sys

PACKAGES = ("torch", "triton", "diffusers", "transformers", "ray", "torchmetrics", "imageio-ffmpeg")
STARTUP_PACKAGES = ("torch", "diffusers", "transformers")  # the bulk of a worker's imports


def report_lines() -> list[str]:
    """Every line of `sagevideo env`; ValueError for a misspelt SAGEVIDEO_SM90_KERNEL."""
    import torch

    from sagevideo.attention.environment import attention_lines
    from sagevideo.version import package_versions

    lines = ["sagevideo environment", ""]
    for name, version in package_versions(PACKAGES).items():
        lines.append(f"  {name:15s} {version or 'not installed'}")
    lines.append(f"  {'python':15s} {platform.python_version()}")
    lines.append(f"  {'CUDA (torch)':15s} {torch.version.cuda or 'none (CPU build)'}")
    interpret = os.environ.get("TRITON_INTERPRET", "")
    lines.append(f"  {'TRITON_INTERPRET':15s} {interpret or 'unset'}")
    lines += ["", *attention_lines()]
    lines += ["", *recipe_lines()]
    return lines


def recipe_lines() -> list[str]:
    """What this machine can run of the speed recipe (--compile, --linear, --cache)."""
    from sagevideo.pipelines.recipe import capabilities

    can = capabilities()
    return [
        f"speed recipe on {can['device']} (--compile, --linear, --cache; checked again for each batch):",
        f"  {'torchao':15s} {can['torchao'] or 'not installed (pip install torchao, for --linear fp8)'}",
        f"  {'--linear fp8':15s} {can['fp8_linears']}",
        f"  {'--compile':15s} regional with Inductor: {can['inductor']} (--compile-backend eager always traces)",
        f"  {'--cache':15s} diffusers hooks here: {', '.join(can['diffusers_caches']) or 'none'}",
        f"  {'compile cache':15s} {can['compile_cache']} ($SAGEVIDEO_COMPILE_CACHE overrides; "
        "TORCHINDUCTOR_CACHE_DIR and TRITON_CACHE_DIR, when set, win)",
        f"  {'bytecode':15s} {bytecode_line()}",
    ]


def without_bytecode(sources: list[str]) -> list[str]:
    """The Python source files among `sources` with no cached bytecode where this interpreter
    looks for it (`__pycache__` beside them, or under PYTHONPYCACHEPREFIX)."""
    return [src for src in sources if not os.path.exists(importlib.util.cache_from_source(src))]


def bytecode_line() -> str:
    """Whether a new worker process finds its big imports byte-compiled. Without bytecode, and
    with writing it off (PYTHONDONTWRITEBYTECODE, common in container images), every process
    compiles torch's, diffusers' and transformers' sources again: on an H200 host that was about
    12 s of a worker's start-up (docs/recipe.md)."""
    sources = []
    for name in STARTUP_PACKAGES:
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.origin and spec.origin.endswith(".py"):
            sources.append(spec.origin)
    missing = [os.path.basename(os.path.dirname(src)) for src in without_bytecode(sources)]
    if not missing:
        return "cached for " + ", ".join(STARTUP_PACKAGES) + " (worker start-ups import them compiled)"
    if not sys.dont_write_bytecode:
        return f"none yet for {', '.join(missing)}: written by the first process that imports them"
    return (f"none for {', '.join(missing)}, and PYTHONDONTWRITEBYTECODE is set: every worker start compiles "
            "their sources again (about 12 s on an H200 host); byte-compile them once (python -m compileall "
            "on site-packages, as pip install does) or give PYTHONPYCACHEPREFIX=DIR with that variable unset")
