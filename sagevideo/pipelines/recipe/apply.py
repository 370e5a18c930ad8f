"""The recipe as a whole: what this machine and model cannot run of it (`recipe_problems`), what the
machine can (`capabilities`), and applying it in the order that composes (`apply_recipe` ->
`AppliedRecipe`, recorded per job)."""

from __future__ import annotations

import importlib.util
import time
from dataclasses import dataclass, field
from typing import Any

from sagevideo.jobs.recipe import Recipe
from sagevideo.pipelines.recipe.compile import compile_block_forwards, inductor_problem
from sagevideo.pipelines.recipe.compile_cache import compile_cache_counts, compile_cache_dir, use_compile_cache
from sagevideo.pipelines.recipe.fp8_linears import Bf16Steps, fp8_linear_problem, fp8_linears
from sagevideo.pipelines.recipe.step_cache import CACHE_CONFIGS, diffusers_has, enable_cache


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
        "diffusers_caches": [name for name, (cls, _) in CACHE_CONFIGS.items() if diffusers_has(cls)],
        "compile_cache": str(compile_cache_dir()),
    }


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
    wrap the compiled block forwards: `compile_block_forwards`). Every
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
        fp8_linears(denoisers, recipe.linear_keep, applied)
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
            compile_block_forwards(transformer, blocks, recipe.compile_backend, applied)
        if recipe.cache != "none":
            enable_cache(pipe_or_transformer, transformer, blocks, recipe, applied)
    applied.apply_s = time.perf_counter() - start
    return applied
