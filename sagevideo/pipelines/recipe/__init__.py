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

One module per technique: `fp8_linears`, `compile` (regional compile), `step_cache` (diffusers'
caches), `compile_cache` (the persistent compile cache); `apply` composes them. The names above
are importable from this package.

Attention installed later (a job with another plan) still runs: the compiled blocks re-trace
for the new processors (Dynamo guards on them).

"""

from sagevideo.pipelines.recipe.apply import (
    AppliedRecipe,
    apply_recipe,
    capabilities,
    recipe_problems,
    transformer_blocks,
)
from sagevideo.pipelines.recipe.compile import contiguous_inputs, inductor_problem, row_major_strides
from sagevideo.pipelines.recipe.compile_cache import (
    COMPILE_CACHE_ENV,
    DEFAULT_COMPILE_CACHE,
    compile_cache_counts,
    compile_cache_dir,
    compile_cache_folders,
    compile_cache_problems,
    use_compile_cache,
)
from sagevideo.pipelines.recipe.fp8_linears import FP8_MULTIPLE, Bf16Steps, fp8_linear_problem, torchao_problem
from sagevideo.pipelines.recipe.step_cache import CACHE_CONFIGS

__all__ = [
    "CACHE_CONFIGS", "COMPILE_CACHE_ENV", "DEFAULT_COMPILE_CACHE", "FP8_MULTIPLE", "AppliedRecipe", "Bf16Steps",
    "apply_recipe", "capabilities", "compile_cache_counts", "compile_cache_dir", "compile_cache_folders",
    "compile_cache_problems", "contiguous_inputs", "fp8_linear_problem", "inductor_problem", "recipe_problems",
    "row_major_strides", "torchao_problem", "transformer_blocks", "use_compile_cache",
]
