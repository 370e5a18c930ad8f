"""The speed recipe on a loaded pipeline: FP8 linears (torchao), step caching (diffusers' hooks)
and regional torch.compile, applied in the order that composes, after the attention is installed.

- `recipe_problems(recipe, source, device, dtype, gpus_per_job)`: why this machine or model cannot
  run a `Recipe`, before anything loads (`plan_batch` lists them with the batch's other problems).
- `apply_recipe(pipe, recipe)` -> `AppliedRecipe`: 1. linear "fp8": torchao's
  `quantize_(block, Float8DynamicActivationFloat8WeightConfig(granularity=PerRow()))` on the
  transformer blocks' nn.Linear layers (but `linear_keep` and layers whose dims are not multiples
  of 16, which float8 GEMMs cannot take), Inductor's settings left alone, their bf16 weights kept
  for `linear_bf16_steps` (`Bf16Steps`, swapped between steps by the job's `on_step`);
  2. compile "regional": each repeated block's own `forward` compiled (the classes the model
  declares in `_repeated_blocks`, as diffusers' `compile_repeated_blocks` takes them, else the
  blocks of the transformer's block lists, found by diffusers' block names), with a pre-hook
  outside the compiled code that copies inputs to row-major strides (`contiguous_inputs`), so one
  graph serves every block of a class; 3. the cache's hooks
  (`transformer.enable_cache(<diffusers config>)`) wrap the compiled forwards and stay outside the
  compiled code. Compiled code goes to a persistent folder
  (`use_compile_cache`).
- `compile_cache_problems(device)`: why compiled code could not be written to the compile-cache
  folders (`compile_cache_folders`), before anything imports torch._dynamo (`plan_batch` asks).
- `capabilities(device)`: what this machine can run (for `sagevideo env`).

Attention installed later (a job with another plan) still runs: the compiled blocks re-trace
for the new processors (Dynamo guards on them).
"""

from __future__ import annotations

import fnmatch
import importlib.util
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sagevideo.choices import FP8_CAPABILITY, has_fp8_tensor_cores
from sagevideo.jobs.recipe import Recipe

COMPILE_CACHE_ENV = "SAGEVIDEO_COMPILE_CACHE"  # overrides the folder below
DEFAULT_COMPILE_CACHE = Path("~/.cache/sagevideo/compile")
FP8_MULTIPLE = 16  # float8 GEMMs (torch._scaled_mm) need in/out features divisible by 16


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


# --- what the machine and the model can run (no model loaded) -----------------------------------


def torchao_problem() -> str | None:
    """Why torchao's float8 linears cannot be used here (not installed, too old), or None."""
    if importlib.util.find_spec("torchao") is None:
        return "torchao is not installed (pip install torchao)"
    try:
        from torchao.quantization import Float8DynamicActivationFloat8WeightConfig, PerRow  # noqa: F401
    except ImportError as err:
        return f"this torchao has no Float8DynamicActivationFloat8WeightConfig/PerRow ({err}); upgrade torchao"
    return None


def fp8_linear_problem(device: str, dtype: str) -> str | None:
    """Why float8 rowwise linears cannot run on `device` in `dtype`, or None."""
    import torch

    sm = "sm" + "".join(map(str, FP8_CAPABILITY))
    if device != "cuda" or not torch.cuda.is_available():
        return f"float8 linears need a CUDA GPU with FP8 tensor cores ({sm}+), not {device}"
    if not has_fp8_tensor_cores(device):
        major, minor = torch.cuda.get_device_capability()
        return f"float8 linears need FP8 tensor cores ({sm}+); this GPU is sm{major}{minor}"
    if dtype != "bfloat16":
        return f"float8 rowwise linears run on bfloat16 models, not {dtype}; use --dtype bfloat16"
    return torchao_problem()


def inductor_problem(device: str) -> str | None:
    """Why torch.compile's Inductor backend cannot generate code for `device`, or None."""
    if device == "cuda":
        return None if importlib.util.find_spec("triton") is not None else "Inductor needs Triton on CUDA"
    cxx = os.environ.get("CXX") or next((c for c in ("g++", "clang++", "c++") if shutil.which(c)), None)
    if cxx is None or shutil.which(cxx) is None:
        return "Inductor on CPU needs a C++ compiler (g++ or clang++; $CXX) and none was found"
    return None


def recipe_problems(
    recipe: Recipe, source: Any, device: str, dtype: str, gpus_per_job: int = 1
) -> list[tuple[str, str]]:
    """(option with its value, why it cannot run) for each setting of `recipe` that this machine,
    the model's family or the batch cannot run; [] when it can. Nothing is loaded."""
    problems = []
    if recipe.compile != "none" and recipe.compile_backend == "inductor":
        problem = inductor_problem(device)
        if problem:
            problems.append((f"--compile {recipe.compile}", f"{problem}; or use --compile-backend eager"))
    if recipe.linear == "fp8":
        problem = fp8_linear_problem(device, dtype)
        if problem:
            problems.append(("--linear fp8", f"{problem}; or use --linear bf16"))
    if recipe.cache != "none":
        family = source.model_family
        caches = getattr(family, "step_caches", ())
        if recipe.cache not in caches:
            which = ", ".join(caches) or "none"
            problems.append((f"--cache {recipe.cache}",
                             f"the {family.title} transformer does not take this diffusers cache (it takes: {which})"))
        elif gpus_per_job > 1:
            problems.append((f"--cache {recipe.cache}", (
                f"step caching with --gpus-per-job {gpus_per_job} would let each rank decide on its own shard "
                "whether to skip blocks (and the ranks disagree); use --gpus-per-job 1 or --cache none")))
    return problems


def capabilities(device: str | None = None) -> dict[str, Any]:
    """What this machine can run of the recipe: torchao, float8 linears, Inductor, the caches
    diffusers ships, and the compile-cache folder. device None: CUDA when torch sees one, else CPU."""
    import torch

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    torchao_version = None
    if importlib.util.find_spec("torchao") is not None:
        from importlib.metadata import PackageNotFoundError, version

        try:
            torchao_version = version("torchao")
        except PackageNotFoundError:
            torchao_version = "unknown"
    return {
        "device": device,
        "torch": torch.__version__,
        "torchao": torchao_version,
        "fp8_linears": fp8_linear_problem(device, "bfloat16") or "yes",
        "inductor": inductor_problem(device) or "yes",
        "diffusers_caches": [name for name, (cls, _) in CACHE_CONFIGS.items() if _diffusers_has(cls)],
        "compile_cache": str(compile_cache_dir()),
    }


# name -> (diffusers.hooks config class, what the manifest says of its skipped forwards)
CACHE_CONFIGS: dict[str, tuple[str, str]] = {
    "first-block": ("FirstBlockCacheConfig", "counted"),
    "taylorseer": ("TaylorSeerCacheConfig", "not exposed by diffusers"),
    "pyramid-broadcast": ("PyramidAttentionBroadcastConfig", "not exposed by diffusers"),
}


def _diffusers_has(name: str) -> bool:
    import diffusers.hooks

    return hasattr(diffusers.hooks, name)


# --- applying it ---------------------------------------------------------------------------------


@dataclass
class Bf16Steps:
    """linear_bf16_steps at work: each float8 linear's bf16 weight kept beside its float8 one and
    put back for the job's bf16 steps (`use`, called between steps, outside compiled code). A
    compiled block compiles once for each kind of weight and then runs either without recompiling."""

    recipe: Recipe
    weights: list[tuple[Any, Any, Any]]  # (linear, its bf16 weight, its float8 weight)
    job_steps: int | None = None  # the running job's steps; None: no job started (the guard refuses)
    bf16: list[int] = field(default_factory=list)  # this job's bf16 step indices
    ran_bf16: list[int] = field(default_factory=list)  # the steps that ran so far with bf16 weights
    in_bf16: bool = False

    def start(self, steps: int) -> None:
        problem = self.recipe.step_problem(steps)
        if problem:
            raise ValueError(f"--linear-bf16-steps: {problem}")
        self.job_steps, self.bf16, self.ran_bf16 = steps, self.recipe.bf16_steps_of(steps), []
        self.use(0)

    def use(self, step: int) -> None:
        """The weights of step `step` (0-based; `job_steps` and beyond: after the last, kept)."""
        if self.job_steps is None or step >= self.job_steps:
            return
        want = step in self.bf16
        if want != self.in_bf16:
            for linear, bf16_weight, fp8_weight in self.weights:
                linear._parameters["weight"] = bf16_weight if want else fp8_weight
            self.in_bf16 = want
        if want:
            self.ran_bf16.append(step)

    def refuse_unknown_steps(self, module: Any, args: Any) -> None:
        """Forward pre-hook of each denoiser: without a job's steps the right weights are unknown."""
        if self.job_steps is None:
            raise RuntimeError(
                "--linear-bf16-steps: the denoiser ran before a job said its steps, so which steps run in bf16 "
                "is unknown; generate through sagevideo (generate, ab, calibrate, PipelineHost), or call the "
                "AppliedRecipe's start_job(steps=N) before the pipeline and on_step(step, steps) after each step")


@dataclass
class AppliedRecipe:
    """What `apply_recipe` did to a pipeline (recorded per job in the manifest's `recipe`).

    fp8_layers / kept_layers: linear names (inside the denoisers) made float8 / kept in bf16
    (linear_keep, or dims not multiples of 16). compiled_blocks: blocks compiled, over every
    denoiser; compile_via: "repeated blocks' forwards" (the model's `_repeated_blocks`) or "block
    forwards" (its block lists). cache_forwards / cache_skipped: transformer forwards the
    cache decided on and those whose remaining blocks it skipped, since `start_job` (None where
    diffusers does not expose the decision). apply_s: seconds the recipe took to apply (the first
    compiled call pays the compile itself, inside the first job's denoise time);
    `compile_cache_lookups()`: whether that compile came from the persistent cache."""

    recipe: Recipe
    fp8_layers: list[str] = field(default_factory=list)
    kept_layers: list[str] = field(default_factory=list)
    compiled_blocks: int = 0
    compile_via: str | None = None
    compile_cache: dict[str, str] = field(default_factory=dict)
    cache_forwards: int | None = None
    cache_skipped: int | None = None
    apply_s: float = 0.0
    denoisers: list[Any] = field(default_factory=list, repr=False)
    cache_counts_at_start: dict[str, int] = field(default_factory=dict, repr=False)
    bf16_steps: Bf16Steps | None = field(default=None, repr=False)

    def compile_cache_lookups(self) -> dict[str, int]:
        """The compile caches' hits, misses and bypasses since the recipe was applied or the job
        started (`compile_cache_counts`): a warm start shows hits, a cold one misses, a graph torch
        will not cache bypasses."""
        now = compile_cache_counts()
        return {name: now[name] - self.cache_counts_at_start.get(name, 0) for name in now}

    def start_job(self, transformer: Any = None, steps: int | None = None) -> None:
        """Counters to zero and every denoiser's cache state reset (a new video starts from no
        cached residual). transformer: also reset this one (the applied denoisers always are).
        steps: the job's denoising steps (needed with linear_bf16_steps: step 0's weights are set)."""
        if self.bf16_steps is not None:
            if steps is None:
                raise ValueError("--linear-bf16-steps: start_job needs the job's steps")
            self.bf16_steps.start(steps)
        if self.recipe.compile != "none":
            self.cache_counts_at_start = compile_cache_counts()
        if self.cache_forwards is not None:
            self.cache_forwards = self.cache_skipped = 0
        if self.recipe.cache == "none":
            return
        for module in [*self.denoisers, *([transformer] if transformer is not None else [])]:
            if hasattr(module, "_reset_stateful_cache"):
                module._reset_stateful_cache()

    def on_step(self, step: int, steps: int) -> None:
        """After denoising step `step` (1-based) of `steps`: the next step's linear weights."""
        if self.bf16_steps is not None:
            self.bf16_steps.use(step)

    def record(self) -> dict[str, Any]:
        """The manifest's `recipe` object: the settings and what was applied."""
        data = self.recipe.settings()
        data.update(
            fp8_layers=len(self.fp8_layers) if self.recipe.linear == "fp8" else None,
            kept_layers=self.kept_layers if self.recipe.linear == "fp8" else None,
            compiled_blocks=self.compiled_blocks if self.recipe.compile != "none" else None,
            cache_forwards=self.cache_forwards,
            cache_skipped=self.cache_skipped,
            compile_cache_lookups=self.compile_cache_lookups() if self.recipe.compile != "none" else None,
        )
        if self.bf16_steps is not None:
            data["bf16_steps_ran"] = list(self.bf16_steps.ran_bf16)
        if self.recipe.cache != "none" and self.cache_forwards is None:
            data["cache_skipped_note"] = CACHE_CONFIGS[self.recipe.cache][1]
        return data


def transformer_blocks(transformer: Any) -> list[tuple[str, Any]]:
    """(name, block) of the transformer's repeated blocks: its children that are ModuleLists named
    as diffusers names block lists ("transformer_blocks", "single_transformer_blocks", "blocks", ...)."""
    import torch
    from diffusers.hooks._common import _ALL_TRANSFORMER_BLOCK_IDENTIFIERS

    blocks = []
    for name, child in transformer.named_children():
        if name in _ALL_TRANSFORMER_BLOCK_IDENTIFIERS and isinstance(child, torch.nn.ModuleList):
            blocks += [(f"{name}.{i}", block) for i, block in enumerate(child)]
    return blocks


def apply_recipe(pipe_or_transformer: Any, recipe: Recipe) -> AppliedRecipe:
    """Apply `recipe` to every denoiser of a loaded pipeline (or to a transformer), after its
    attention is installed: float8 linears, then regional compile, then the cache hooks (which
    wrap the compiled block forwards: `_compile_block_forwards`). Every
    denoiser `install` covers gets it (Wan 2.2's `transformer_2` as well as `transformer`); layer
    names of a second denoiser start with its component ("transformer_2.blocks.0...."). Raises
    ValueError when a setting cannot apply to this model (a linear_keep pattern that names no
    layer of any denoiser, a cache on a model without enough blocks)."""
    from sagevideo.pipelines.install import denoisers_of

    applied = AppliedRecipe(recipe)
    applied.cache_counts_at_start = compile_cache_counts()
    start = time.perf_counter()
    denoisers = [("" if component == "transformer" else f"{component}.", transformer, transformer_blocks(transformer))
                 for component, transformer in denoisers_of(pipe_or_transformer).items()]
    applied.denoisers = [transformer for _, transformer, _ in denoisers]
    if recipe.linear == "fp8":
        _fp8_linears(denoisers, recipe.linear_keep, applied)
        if applied.bf16_steps is not None:  # None where every linear stayed bf16: nothing to swap
            for transformer in applied.denoisers:
                transformer.register_forward_pre_hook(applied.bf16_steps.refuse_unknown_steps)
    for _, transformer, blocks in denoisers:
        if recipe.compile == "regional":
            applied.compile_cache = use_compile_cache()
            # The blocks' own forwards, not the modules (module.compile): a cache's hooks replace
            # each block's forward with Python that decides, per step, whether the block runs.
            # Compiled with the module, Dynamo would trace that decision, guard on the cache's
            # state and recompile as it changes until torch's recompile limit left the blocks
            # eager. Compiled first, the forwards stay under the hooks: called, or skipped.
            _compile_block_forwards(transformer, blocks, recipe.compile_backend, applied)
        if recipe.cache != "none":
            _enable_cache(pipe_or_transformer, transformer, blocks, recipe, applied)
    applied.apply_s = time.perf_counter() - start
    return applied


def _fp8_linears(denoisers: list[tuple[str, Any, list[tuple[str, Any]]]], keep: list[str],
                 applied: AppliedRecipe) -> None:
    """denoisers: (name prefix, transformer, its blocks) of each denoiser."""
    import torch
    from torchao.quantization import Float8DynamicActivationFloat8WeightConfig, PerRow, quantize_

    blocks = [(f"{prefix}{bname}", block) for prefix, _, found in denoisers for bname, block in found]
    linears = [(f"{bname}.{name}", m) for bname, block in blocks for name, m in block.named_modules()
               if isinstance(m, torch.nn.Linear)]
    unmatched = [p for p in keep if not any(fnmatch.fnmatchcase(name, p) for name, _ in linears)]
    if unmatched:
        shown = ", ".join(n for n, _ in linears[:3])
        raise ValueError(f"--linear-keep {unmatched[0]}: names no linear of the transformer's blocks (e.g. {shown})")
    chosen = set()
    for name, module in linears:
        if any(fnmatch.fnmatchcase(name, p) for p in keep) or module.in_features % FP8_MULTIPLE \
                or module.out_features % FP8_MULTIPLE:
            applied.kept_layers.append(name)
        else:
            chosen.add(id(module))
            applied.fp8_layers.append(name)
    # set_inductor_config=False: torchao's default turns on Inductor's coordinate-descent tuning
    # for the whole process, which made the first call of a compiled FP8 block take minutes
    # (Triton configs compiled one after another in the main thread) and changed how every other
    # graph the user compiles is tuned. The recipe leaves Inductor's settings as the user set them.
    config = Float8DynamicActivationFloat8WeightConfig(granularity=PerRow(), set_inductor_config=False)
    kept = {id(m): (m, m.weight) for _, m in linears if id(m) in chosen} if applied.recipe.linear_bf16_steps else {}
    for _, block in blocks:
        quantize_(block, config, filter_fn=lambda module, fqn: id(module) in chosen)
    if kept:
        applied.bf16_steps = Bf16Steps(applied.recipe, [(m, bf16, m.weight) for m, bf16 in kept.values()])


def _cache_config(pipe: Any, recipe: Recipe) -> Any:
    import diffusers.hooks as hooks

    if recipe.cache == "first-block":
        return hooks.FirstBlockCacheConfig(threshold=recipe.threshold)
    if recipe.cache == "taylorseer":
        return hooks.TaylorSeerCacheConfig()
    if recipe.cache == "pyramid-broadcast":
        if not hasattr(type(pipe), "current_timestep"):
            raise ValueError("--cache pyramid-broadcast needs the pipeline's current timestep; this pipeline has none")
        return hooks.PyramidAttentionBroadcastConfig(
            spatial_attention_block_skip_range=2, current_timestep_callback=lambda: pipe.current_timestep
        )
    raise ValueError(f"--cache {recipe.cache}: unknown cache")


def _enable_cache(pipe: Any, transformer: Any, blocks: list[tuple[str, Any]], recipe: Recipe,
                  applied: AppliedRecipe) -> None:
    if not hasattr(transformer, "enable_cache"):
        raise ValueError(f"--cache {recipe.cache}: {type(transformer).__name__} has no diffusers cache support")
    if recipe.cache == "first-block" and len(blocks) < 2:
        raise ValueError(f"--cache first-block needs at least 2 transformer blocks (a first and a last); "
                         f"this model has {len(blocks)}")
    transformer.enable_cache(_cache_config(pipe, recipe))
    if recipe.cache == "first-block":
        _count_first_block_decisions(blocks[0][1], applied)


def _count_first_block_decisions(head_block: Any, applied: AppliedRecipe) -> None:
    """Count FirstBlockCache's decisions where diffusers makes them: its head-block hook's
    `_should_compute_remaining_blocks` (run outside compiled graphs: it is compiler-disabled)."""
    import torch
    from diffusers.hooks import HookRegistry
    from diffusers.hooks.first_block_cache import _FBC_LEADER_BLOCK_HOOK

    hook = HookRegistry.check_if_exists_or_initialize(head_block).get_hook(_FBC_LEADER_BLOCK_HOOK)
    if hook is None:
        raise ValueError("--cache first-block: diffusers registered no first-block hook on the first block")
    decide = hook._should_compute_remaining_blocks
    applied.cache_forwards = applied.cache_skipped = 0

    @torch.compiler.disable
    def counted(residual: Any) -> bool:
        compute = decide(residual)
        applied.cache_forwards += 1
        applied.cache_skipped += 0 if compute else 1
        return compute

    hook._should_compute_remaining_blocks = counted


def _compile_block_forwards(transformer: Any, blocks: list[tuple[str, Any]], backend: str,
                            applied: AppliedRecipe) -> None:
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
