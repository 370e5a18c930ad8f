"""The persistent compile cache of regional compile: where Inductor's and Triton's caches go
(`compile_cache_folders`: $SAGEVIDEO_COMPILE_CACHE unless the user set torch's own variables),
whether they can be written (`compile_cache_problems`, before anything imports torch._dynamo),
pointing torch at them (`use_compile_cache`) and their lookups (`compile_cache_counts`)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

COMPILE_CACHE_ENV = "SAGEVIDEO_COMPILE_CACHE"  # overrides the folder below
DEFAULT_COMPILE_CACHE = Path("~/.cache/sagevideo/compile")


def compile_cache_dir() -> Path:
    """The persistent compile-cache folder: $SAGEVIDEO_COMPILE_CACHE, else ~/.cache/sagevideo/compile."""
    return Path(os.environ.get(COMPILE_CACHE_ENV) or DEFAULT_COMPILE_CACHE).expanduser()


def compile_cache_folders() -> dict[str, tuple[Path, str]]:
    """{torch's variable: (the folder it will name, the variable that decides it)} for Inductor's
    cache (TORCHINDUCTOR_CACHE_DIR) and Triton's (TRITON_CACHE_DIR): folders of
    `compile_cache_dir()` unless the user set them. Nothing is changed (`use_compile_cache` sets them)."""
    root = compile_cache_dir()
    folders = {"TORCHINDUCTOR_CACHE_DIR": (root / "inductor", COMPILE_CACHE_ENV),
               "TRITON_CACHE_DIR": (root / "triton", COMPILE_CACHE_ENV)}
    inductor = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if inductor and not _torch_default(inductor):
        folders["TORCHINDUCTOR_CACHE_DIR"] = (Path(inductor), "TORCHINDUCTOR_CACHE_DIR")
    if os.environ.get("TRITON_CACHE_DIR"):
        folders["TRITON_CACHE_DIR"] = (Path(os.environ["TRITON_CACHE_DIR"]), "TRITON_CACHE_DIR")
    return folders


def _torch_default(folder: str) -> bool:
    """Whether TORCHINDUCTOR_CACHE_DIR holds torch's own default, <tmp>/torchinductor_<user>, which
    torch writes into the variable when torch._dynamo is imported (here or in a parent process):
    not a user's choice. Compared by its form, not through torch's helper: importing that imports
    torch._dynamo, which creates the folder (and fails on a bad one)."""
    path = Path(folder)
    return path.name.startswith("torchinductor_") and path.parent == Path(tempfile.gettempdir())


def compile_cache_problems(device: str, *, compiling: bool = True) -> list[str]:
    """Why compiled code could not be written (each folder once, naming the variable to set), or [].
    The folders are created (a probe file is written and removed); Triton's matters on CUDA only.
    compiling False: only a TORCHINDUCTOR_CACHE_DIR the user set, which torch creates whenever
    torch._dynamo is imported (diffusers imports it), so a bad one fails every run.
    Needs no torch import: call it before anything imports torch._dynamo."""
    from sagevideo.outputs.folders import folder_write_problem

    problems = []
    for variable, (folder, decided_by) in compile_cache_folders().items():
        wanted = compiling or decided_by == "TORCHINDUCTOR_CACHE_DIR"
        if not wanted or (variable == "TRITON_CACHE_DIR" and device != "cuda"):
            continue
        problem = folder_write_problem(folder)
        if problem:
            given = os.environ.get(decided_by)
            why = f"{decided_by}={given}" if given else f"the default under HOME, {DEFAULT_COMPILE_CACHE}"
            unset = "" if decided_by == COMPILE_CACHE_ENV else ", or unset it"
            problems.append(f"the compile cache {folder} ({why}) cannot be written ({problem}); "
                            f"set {decided_by} to a writable folder{unset}")
    return problems


def use_compile_cache() -> dict[str, str]:
    """Point torch's own caches at `compile_cache_dir()` (unless the user set them): Inductor's
    (TORCHINDUCTOR_CACHE_DIR: FX-graph cache, kernels, autotuning) and Triton's (TRITON_CACHE_DIR),
    with Inductor's FX-graph cache on, so a compile is paid once per machine, not per process.
    Returns {variable: folder} as used."""
    import torch._inductor.config as inductor_config

    from sagevideo.attention.records import allow_caching_graphs_with_records

    for variable, (folder, _) in compile_cache_folders().items():
        os.environ[variable] = str(folder)
    inductor_config.fx_graph_cache = True
    allow_caching_graphs_with_records()  # else graphs with sagevideo attention were never cached
    return {name: os.environ[name] for name in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")}


# torch._dynamo's counters of the two caches a warm start reads: Inductor's FX-graph cache (the
# generated code) and AOTAutograd's (the traced forward graphs). Dynamo's own tracing has none.
COMPILE_CACHE_COUNTERS = (
    ("inductor", "fxgraph_cache_hit"), ("inductor", "fxgraph_cache_miss"), ("inductor", "fxgraph_cache_bypass"),
    ("aot_autograd", "autograd_cache_hit"), ("aot_autograd", "autograd_cache_miss"),
    ("aot_autograd", "autograd_cache_bypass"),
)


def compile_cache_counts() -> dict[str, int]:
    """Lookups of the compile caches so far in this process: {counter name: count}."""
    from torch._dynamo.utils import counters

    return {name: counters[group][name] for group, name in COMPILE_CACHE_COUNTERS}
