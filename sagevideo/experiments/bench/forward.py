"""`sagevideo bench forward`: whole transformer forwards per speed recipe, side by side in one run.

A recipe's name is `[fp8-](eager|compile)-(cudnn|sdpa|sage)[-first-block|-taylorseer]`, a preset
of the recipe's text form (`sagevideo.jobs.recipe.parse_recipe`; `recipe_name_text` gives the text a
name stands for, e.g. fp8-compile-sage-first-block: linear=fp8,compile=regional,cache=first-block
with sagevideo attention): fp8 = torchao float8 rowwise linears
on the blocks, compile = regional (each block `torch.compile`d), a cache = diffusers' step-caching
hook (the forwards repeat the same inputs, so after the first call a cache skips what it can: its
best case, not a denoising run's), sage = sagevideo's attention
installed (its default plan), cudnn = stock attention under SDPA with cuDNN first (flash, then
efficient, for calls cuDNN refuses; on the CPU, torch's own choice), sdpa = stock attention as
torch picks its SDPA backend (what diffusers runs as shipped; eager recipes record which backend
torch picked per call, `sdpa_backends`, as they do under cudnn). Each recipe runs on a freshly
built model of the same seed (compile and fp8 change the model), through sagevideo's own recipe
(`pipelines.recipe.apply_recipe`). Per recipe: the first call's seconds (compile included; the
Inductor cache is the product's persistent one, so a second run shows a warm start), the median
ms of one denoising step's forwards, × eager cuDNN and × compile cuDNN (their ms / this one's;
× eager SDPA too where eager-sdpa ran),
the output's cosine against eager cuDNN (fp64) and the attention backends that ran.

The model is one of `pipelines.forwards.CONFIGS` at real size with random weights (the time
depends on the shapes, not the values), or a tiny one.

`--sparse METHOD:DENSITY` makes the sage recipes block-sparse as a sparse step of `generate
--sparse` runs them (`pipelines.sparse.job_plan` on the bare transformer: every layer its family
may make sparse but the first, text rows and columns dense); each recipe's record gives the mean
density its sparse calls reached and how many calls the plan kept dense (the first layer, layers
its family never makes sparse such as Wan's cross-attention, calls that could not be sparse), so
that many small dense calls do not make a sparse model read as a dense one. Compiled recipes are
noted too: they run sparse in whole graphs and their calls are noted as eager ones
(`pipelines.sparse_notes`). Random weights make attention near-uniform, so the density dynamic
selection reaches here says nothing of a real model's (static windows reach the density asked);
the time is what matters here. With `dynamic:D:reuseN` a timed unit is a run of N denoising steps
(the step clock moved before each forward: the first selects, the N-1 after it attend on the kept
lists) and ms is its time over N, the mean step of such a run.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import time
from collections.abc import Callable, Iterator
from typing import Any

from pydantic import BaseModel, Field, field_validator

from sagevideo.choices import CompileBackend, DType, parse_sparse
from sagevideo.errors import InputError
from sagevideo.experiments.bench.attention import SageBackend
from sagevideo.experiments.bench.timing import (
    BenchOptions,
    BenchReport,
    ModelConfigOptions,
    machine,
    median_seconds,
    now,
    output_cosine,
    resolve_device_dtype,
    synchronizer,
)
from sagevideo.jobs.sparse import SparseOptions, is_sparse

SCHEMA = "sagevideo.bench.forward"
DEFAULT_RECIPES = ("eager-cudnn", "eager-sage", "compile-cudnn", "compile-sage", "fp8-compile-sage")
BASELINES = {"x_eager_cudnn": "eager-cudnn", "x_compile_cudnn": "compile-cudnn", "x_eager_sdpa": "eager-sdpa"}
ATTENTION_KINDS = ("cudnn", "sdpa", "sage")
# Caches a recipe name may end with; pyramid-broadcast reads a pipeline's current timestep, which a
# transformer's forwards alone do not have.
NAMED_CACHES = ("first-block", "taylorseer")
RECIPE_NAME_FORM = "[fp8-](eager|compile)-(cudnn|sdpa|sage)[-first-block|-taylorseer]"


def recipe_name_text(name: str) -> tuple[str, str]:
    """(attention kind, recipe text form) that a recipe name stands for: 'fp8-compile-sage-first-block'
    -> ("sage", "compile=regional,linear=fp8,cache=first-block"); raises ValueError for a name not of
    `RECIPE_NAME_FORM`."""
    from sagevideo.jobs.recipe import Recipe

    cache = next((c for c in NAMED_CACHES if name.endswith(f"-{c}")), "none")
    parts = (name.removesuffix(f"-{cache}") if cache != "none" else name).split("-")
    linear = "fp8" if parts[0] == "fp8" else "bf16"
    parts = parts[1:] if linear == "fp8" else parts
    if len(parts) != 2 or parts[0] not in ("eager", "compile") or parts[1] not in ATTENTION_KINDS:
        raise ValueError(f"{name!r} is not {RECIPE_NAME_FORM}, e.g. compile-sage")
    compile_mode = "regional" if parts[0] == "compile" else "none"
    return parts[1], Recipe(compile=compile_mode, linear=linear, cache=cache).text()


def parse_recipe_name(name: str) -> dict[str, str]:
    """'fp8-compile-sage' -> {"linear": "fp8", "compile": "regional", "cache": "none", "attention": "sage"}
    (`recipe_name_text`); raises ValueError for a name not of `RECIPE_NAME_FORM`."""
    from sagevideo.jobs.recipe import parse_recipe

    attention, text = recipe_name_text(name)
    recipe = parse_recipe(text)
    return {"linear": recipe.linear, "compile": recipe.compile, "cache": recipe.cache, "attention": attention}


class BenchForwardConfig(BenchOptions, ModelConfigOptions, SparseOptions):
    """Which recipes, on which transformer config (`ModelConfigOptions`), where (`BenchOptions`),
    block-sparse or not (`SparseOptions`: the sage recipes')."""

    recipes: list[str] = Field(["default"], description=f"comma list of {RECIPE_NAME_FORM}, or "
                               f"default: {','.join(DEFAULT_RECIPES)} (fp8 left out where it cannot run)")
    repeats: int = Field(3, ge=1, description="timed calls per recipe after the first (median reported)")
    compile_backend: CompileBackend | None = Field(None, description="torch.compile backend of the compile "
                                                   "recipes (default inductor on a GPU, eager on the CPU)")
    backend: SageBackend = Field("auto", description="sageattn backend of the sage recipes (auto: triton on a "
                                 "GPU, reference on the CPU)")
    dtype: DType | None = Field(None, description="model dtype (default bfloat16 on a GPU, float32 on the CPU)")

    @field_validator("recipes", mode="before")
    @classmethod
    def _split_commas(cls, value: Any) -> Any:
        values = [value] if isinstance(value, str) else value
        if isinstance(values, list):
            return [name.strip() for item in values for name in str(item).split(",") if name.strip()]
        return value


class ForwardBenchPlan(BaseModel):
    """A config resolved against this machine: every check done, nothing built yet."""

    device: str
    dtype: str
    recipes: list[str]
    compile_backend: str
    backend: str
    left_out: dict[str, str] = {}  # default recipes this machine cannot run: name -> why
    estimate_s: float | None = None  # the run's time here (`run_budget`; None: not estimated, a GPU or small)


def resolve(config: BenchForwardConfig) -> ForwardBenchPlan:
    """Check `config` on this machine; raises InputError (a recipe name that does not parse, no GPU,
    a recipe this machine cannot run, a model that cannot fit in memory or would take longer than
    --max-hours here: `run_budget`) before any model is built. "default" drops the recipes that
    cannot run here, saying why."""
    if not config.recipes:
        raise InputError("--recipes: none named; e.g. default or eager-cudnn,compile-sage")
    size_problem = config.size_problem(config.model)
    if size_problem:
        raise InputError(size_problem)
    from sagevideo.outputs.files import writable_file
    from sagevideo.pipelines.recipe import fp8_linear_problem, inductor_problem

    if config.json_out is not None:
        writable_file(config.json_out, "--json", InputError, "bench.json")
    if config.append_results is not None:
        writable_file(config.append_results, "--append-results", InputError, "results.jsonl")
    device, dtype = resolve_device_dtype(config.device, config.dtype)
    compile_backend, backend = recipe_backends(device, config.compile_backend, config.backend)
    names, left_out, problems = [], {}, []
    for entry in config.recipes:
        for name in (DEFAULT_RECIPES if entry == "default" else (entry,)):
            try:
                spec = parse_recipe_name(name)
            except ValueError as err:
                problems.append(f"--recipes {name}: {err}")
                continue
            why = [fp8_linear_problem(device, dtype) if spec["linear"] == "fp8" else None]
            if spec["compile"] == "regional" and compile_backend == "inductor" and inductor_problem(device):
                why.append(f"{inductor_problem(device)}; or use --compile-backend eager")
            reason = "; ".join(w for w in why if w)
            if reason and entry == "default":
                left_out[name] = reason
            elif reason:
                problems.append(f"--recipes {name}: {reason}")
            elif name not in names:
                names.append(name)
    if problems:
        raise InputError("\n".join(problems))
    if not names:
        raise InputError("--recipes: none of them can run here: " + "; ".join(f"{n}: {w}" for n, w in left_out.items()))
    check_sparse_recipes(config.sparse, names)
    from sagevideo.experiments.run_budget import check_model_run

    steps = {"stock": 0, "sage": 0}
    for name in names:  # each recipe: its first call, median_seconds' warm-up, the repeats
        steps["sage" if parse_recipe_name(name)["attention"] == "sage" else "stock"] += 2 + config.repeats
    estimate = check_model_run(config.model, config.size(), device, dtype, steps=steps, max_hours=config.max_hours)
    return ForwardBenchPlan(device=device, dtype=dtype, recipes=names, compile_backend=compile_backend,
                            backend=backend, left_out=left_out, estimate_s=estimate.seconds)


class RecipeResult(BaseModel):
    """One recipe's figures (see the module docstring); skipped: why it was not run."""

    name: str
    recipe: str | None = None
    ms: float | None = None
    first_call_s: float | None = None
    x_eager_cudnn: float | None = None
    x_compile_cudnn: float | None = None
    x_eager_sdpa: float | None = None
    output_cos_vs_eager_cudnn: float | None = None
    backends: dict[str, int] = {}
    sdpa_backends: dict[str, int] = {}  # stock attention, eager: the SDPA backend torch picked, per call
    fp8_layers: int = 0
    compiled_blocks: int = 0
    compile_cache_lookups: dict[str, int] = {}  # the first call's: a warm start hits, a cold one misses
    sparse: str | None = None  # a sage recipe's block-sparse setting (`--sparse`)
    density: float | None = None  # ... the mean density of the calls its plan made sparse
    sparse_calls: int | None = None  # ... how many calls those were
    reused_calls: int | None = None  # ... of which attended on lists kept from an earlier step (reuseN)
    dense_calls: int | None = None  # ... and the calls under the plan that ran dense (kept dense or could not)
    skipped: str | None = None


class ForwardBenchReport(BenchReport):
    schema_: str = Field(SCHEMA, alias="schema")
    model: str
    size: dict[str, int | None] = {}  # frames, height, width given (None: the model's default)
    tokens: int
    forwards_per_step: int
    compile_backend: str
    repeats: int
    recipes: list[RecipeResult]

    def table(self) -> str:
        return "\n".join([f"{self.model} ({self.tokens} video tokens, {self.forwards_per_step} forward(s) a step) on "
                          f"{self.machine['device_name']} ({self.device}, {self.dtype}), compile backend "
                          f"{self.compile_backend}", *recipe_table(self.recipes)])

    def result_rows(self, run: Any) -> None:
        """`recipe_rows` at shape = the model config's name (with its size when one was given)."""
        given = "x".join(str(v) for v in self.size.values() if v)
        recipe_rows(run, f"{self.model}[{given}]" if given else self.model, self.recipes)

    def summary(self) -> str:
        """The fastest recipe against eager cuDNN (or the first recipe when eager cuDNN was not run)."""
        ran = [r for r in self.recipes if r.ms]
        if not ran:
            return "no recipe ran"
        best = min(ran, key=lambda r: r.ms or 0.0)
        if best.x_eager_cudnn is None:
            return f"fastest {best.name} {best.ms:.1f} ms"
        versus_sdpa = "" if best.x_eager_sdpa is None else f", {best.x_eager_sdpa:.2f}x eager SDPA (torch's pick)"
        return f"fastest {best.name} {best.ms:.1f} ms, {best.x_eager_cudnn:.2f}x eager cuDNN{versus_sdpa}"


def recipe_rows(run: Any, shape: str, results: list[RecipeResult]) -> None:
    """Add the recipes' figures to `run` (a `results.Run`): variant recipe-NAME, metrics ms,
    x_eager_cudnn, x_compile_cudnn, x_eager_sdpa (where eager-sdpa ran), output_cos_vs_eager_cudnn,
    first_call_s (the backends, the SDPA backends torch picked and the recipe in the ms row's extra),
    and density for block-sparse sage recipes (variant recipe-NAME[sparse=SETTING]); skipped recipes
    have no rows."""
    for r in results:
        if r.skipped:
            continue
        variant = f"recipe-{r.name}" + (f"[sparse={r.sparse}]" if r.sparse else "")
        run.add(shape, variant, "ms", r.ms, backends=r.backends, recipe=r.recipe, sdpa_backends=r.sdpa_backends)
        for metric in ("x_eager_cudnn", "x_compile_cudnn", "x_eager_sdpa", "output_cos_vs_eager_cudnn", "density"):
            run.add(shape, variant, metric, getattr(r, metric))
        run.add(shape, variant, "first_call_s", r.first_call_s, unit="s")


def recipe_table(results: list[RecipeResult]) -> list[str]:
    """The side-by-side table, one line per recipe."""
    def number(value: float | None, fmt: str) -> str:
        width = int(fmt.split(".")[0])
        return f"{'-':>{width}s}" if value is None else format(value, fmt)

    sdpa = any(r.x_eager_sdpa is not None for r in results)  # the column only where eager-sdpa ran
    lines = [f"{'recipe':18s} {'ms':>9s} {'x eager cuDNN':>14s} {'x compile cuDNN':>16s} "
             + (f"{'x eager SDPA':>13s} " if sdpa else "") + f"{'cos vs eager':>13s} {'first call s':>13s}  backends"]
    for r in results:
        if r.skipped:
            lines.append(f"{r.name:18s} not run: {r.skipped}")
            continue
        ran = r.backends or (f"stock SDPA {r.sdpa_backends}" if r.sdpa_backends else "none (stock SDPA)")
        if r.sparse:
            ran = (f"{ran}; sparse {r.sparse}, density {number(r.density, '5.3f').strip()} over {r.sparse_calls} "
                   f"sparse calls" + (f" ({r.reused_calls} on reused lists)" if r.reused_calls else "")
                   + f", {r.dense_calls} dense")
        lines.append(f"{r.name:18s} {number(r.ms, '9.1f')} {number(r.x_eager_cudnn, '14.2f')} "
                     f"{number(r.x_compile_cudnn, '16.2f')} " + (f"{number(r.x_eager_sdpa, '13.2f')} " if sdpa else "")
                     + f"{number(r.output_cos_vs_eager_cudnn, '13.5f')} {number(r.first_call_s, '13.1f')}  {ran}")
    kept_all = [r.name for r in results if r.sparse and r.sparse.startswith("dynamic") and r.density is not None
                and round(r.density, 3) == 1.0]
    if kept_all:  # random weights: the selection's rule (keep tiles a mean misjudges), not a failure to skip
        lines.append(f"note: {', '.join(kept_all)} skipped no tile (density 1.000): random weights' Q/K tiles are not "
                     "self-similar, so the dynamic selection keeps them all; time a density with --sparse static:D, "
                     "judge a dynamic plan's quality with `sagevideo ab` on the real model")
    return lines


def check_sparse_recipes(sparse: str, names: list[str], option: str = "--recipes") -> None:
    """With a block-sparse `sparse`: InputError unless some of the (parsed) recipes is a sage one
    (eager or compiled: the selection reads nothing on the host); `option` names where the recipes
    were given."""
    if not is_sparse(sparse):
        return
    specs = {name: parse_recipe_name(name) for name in names}
    if not any(spec["attention"] == "sage" for spec in specs.values()):
        raise InputError(f"--sparse {sparse}: applies to sage recipes, none named; e.g. {option} eager-sage")


def recipe_backends(device: str, compile_backend: str | None = None, backend: str = "auto") -> tuple[str, str]:
    """(torch.compile backend, sageattn backend) of the recipes on `device`, those given kept:
    Inductor and the kernels ("auto") on a GPU, eager and the reference emulation on the CPU."""
    gpu = device.split(":")[0] == "cuda"
    return compile_backend or ("inductor" if gpu else "eager"), backend if backend != "auto" or gpu else "reference"


def apply_recipe_name(model: Any, name: str, *, backend: str, compile_backend: str,
                      sparse: str | None = None) -> tuple[Any, Any]:
    """Make `model` run as recipe `name` (`RECIPE_NAME_FORM`): sagevideo attention installed with
    `backend` for a sage recipe (block-sparse as a sparse step of `generate --sparse` where `sparse`
    is a setting), then `pipelines.recipe.apply_recipe` of the recipe text the name stands for.
    Returns (the install's handle, None for cudnn; the AppliedRecipe)."""
    import sagevideo
    from sagevideo.choices import auto_pv
    from sagevideo.jobs.recipe import parse_recipe
    from sagevideo.pipelines.recipe import apply_recipe
    from sagevideo.pipelines.sparse import job_plan

    attention, text = recipe_name_text(name)
    handle = None
    if attention == "sage":
        # a bare transformer has no step: the plan's step-less entries (every layer sparse but the first) apply
        plan = job_plan(model, auto_pv(next(model.parameters()).device), sparse, steps=5) if is_sparse(sparse) else None
        handle = sagevideo.install(model, plan, backend=backend)
    recipe = parse_recipe(",".join(filter(None, (text, f"compile_backend={compile_backend}"))))
    return handle, apply_recipe(model, recipe)


def cache_context(model: Any, recipe: Any) -> contextlib.AbstractContextManager:
    """The step cache's context (diffusers refuses cached forwards outside one) for a recipe with a
    cache, else nothing."""
    return model.cache_context("bench") if recipe.cache != "none" else contextlib.nullcontext()


def stock_attention_order(attention: str, device: str) -> contextlib.AbstractContextManager:
    """The SDPA backend order a recipe's stock attention runs under: torch's own for "sdpa", cuDNN
    first otherwise (`sdpa_cudnn_first`; sage recipes too, for the calls sagevideo leaves to SDPA)."""
    return contextlib.nullcontext() if attention == "sdpa" else sdpa_cudnn_first(device)


@contextlib.contextmanager
def record_sdpa_choices(counts: dict[str, int]) -> Iterator[None]:
    """Count, into `counts` (backend name -> calls), the backend SDPA picks for each
    `F.scaled_dot_product_attention` call made meanwhile (torch's own `_fused_sdp_choice`, under
    whatever `sdpa_kernel` priority is active), each call run unchanged. Eager code only: under
    torch.compile the mode would be traced."""
    import torch
    from torch.nn.attention import SDPBackend
    from torch.overrides import TorchFunctionMode

    sdpa = torch.nn.functional.scaled_dot_product_attention

    class Choices(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func is sdpa:
                name = SDPBackend(torch._fused_sdp_choice(*args, **kwargs)).name.lower()
                counts[name] = counts.get(name, 0) + 1
            return func(*args, **kwargs)

    with Choices():
        yield


@contextlib.contextmanager
def sdpa_cudnn_first(device: str) -> Iterator[None]:
    """SDPA with cuDNN first (flash, efficient, then math, for calls cuDNN refuses: a text encoder's
    float position-bias mask, e.g. T5's, takes none of the fused ones) on a GPU; torch's own choice
    on the CPU (it has no cuDNN)."""
    if device != "cuda":
        yield
        return
    from torch.nn.attention import SDPBackend, sdpa_kernel

    order = [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
    with sdpa_kernel(order, set_priority=True):
        yield


def run_recipes(names: list[str], build: Callable[[], Any], *, device: str, dtype: str, repeats: int,
                compile_backend: str, backend: str, sparse: str | None = None,
                progress: Callable[[str], None] | None = None, bar: bool = False) -> list[RecipeResult]:
    """Each recipe on a fresh `build()` (a `pipelines.forwards.StepForwards`: model and forwards),
    in order; a recipe this machine cannot run (fp8 without FP8 tensor cores) is returned skipped.
    sparse: the sage recipes' block-sparse setting (`--sparse`), None or "off" for dense.
    bar: a progress bar of the denoising steps run, with its ETA (long CPU runs)."""
    import sys

    import torch
    from tqdm.auto import tqdm

    import sagevideo
    from sagevideo.pipelines.recipe import fp8_linear_problem

    results, outputs = [], {}
    sync = synchronizer(device)
    reuse = (parse_sparse(sparse)[2] or 1) if is_sparse(sparse) else 1
    sage = sum(parse_recipe_name(name)["attention"] == "sage" for name in names)
    steps_bar = tqdm(total=(len(names) - sage + sage * reuse) * (2 + repeats), desc="bench forward", unit="step",
                     file=sys.stderr, disable=not bar, dynamic_ncols=True)
    for name in names:
        spec = parse_recipe_name(name)
        problem = fp8_linear_problem(device, dtype) if spec["linear"] == "fp8" else None
        if problem:  # said in the table and the JSON, never measured as something else
            results.append(RecipeResult(name=name, skipped=problem))
            continue
        torch._dynamo.reset()  # a fresh model each recipe: nothing compiled for the last one may be reused
        step = build()
        sage_sparse = sparse if spec["attention"] == "sage" and is_sparse(sparse) else None
        handle, applied = apply_recipe_name(step.model, name, backend=backend, compile_backend=compile_backend,
                                            sparse=sage_sparse)
        run = _counted(step.run, steps_bar.update)
        steps = reuse if sage_sparse else 1
        if steps > 1:
            run = _steps_of_a_run(run, handle.router.clock, steps)
        recipe = applied.recipe
        order = stock_attention_order(spec["attention"], device)
        picked: dict[str, int] = {}
        stock_eager = spec["attention"] != "sage" and recipe.compile == "none"
        with order, sagevideo.record_backends() as log, cache_context(step.model, recipe):
            start = time.perf_counter()
            with record_sdpa_choices(picked) if stock_eager else contextlib.nullcontext():
                out = run()
            sync()
            first_call_s = time.perf_counter() - start
            lookups = applied.compile_cache_lookups() if recipe.compile != "none" else {}
            seconds = median_seconds(run, repeats, device) / steps
        outputs[name] = torch.cat([o.float().flatten().cpu() for o in out])
        result = RecipeResult(name=name, recipe=recipe.label(), ms=seconds * 1e3, first_call_s=first_call_s,
                              backends=dict(log.counts), sdpa_backends=picked, fp8_layers=len(applied.fp8_layers),
                              compiled_blocks=applied.compiled_blocks, compile_cache_lookups=lookups,
                              sparse=sage_sparse, **(_sparse_counts(log) if sage_sparse else {}))
        if "eager-cudnn" in outputs:
            result.output_cos_vs_eager_cudnn = output_cosine(outputs["eager-cudnn"], outputs[name])
        results.append(result)
        if progress:  # as each recipe finishes: a run cut short still said what it measured
            cached = (f" (compiled graphs from the cache: {lookups['fxgraph_cache_hit']} hit, "
                      f"{lookups['fxgraph_cache_miss']} missed, {lookups['fxgraph_cache_bypass']} refused)"
                      if lookups else "")
            progress(f"{name}: {result.ms:.1f} ms, first call {first_call_s:.1f} s{cached}, "
                     f"{result.backends or 'stock SDPA'}")
        if handle is not None:
            handle.remove()
        # every reference to this recipe's model goes before the next is built: two real-size models
        # at once do not fit an 80 GB card (Wan 14B: 28 GB of bf16 weights each, plus activations)
        del step, out, run, handle, applied
        gc.collect()
        if device == "cuda":
            torch.cuda.empty_cache()
    steps_bar.close()
    by_name = {r.name: r for r in results}
    if "eager-cudnn" in outputs:  # recipes run before eager cuDNN get their cosine now
        for r in results:
            if r.name in outputs and r.output_cos_vs_eager_cudnn is None:
                r.output_cos_vs_eager_cudnn = output_cosine(outputs["eager-cudnn"], outputs[r.name])
    for field, base in BASELINES.items():
        if base in by_name and by_name[base].ms:
            for r in results:
                if r.ms:
                    setattr(r, field, by_name[base].ms / r.ms)
    return results


def _sparse_counts(log: Any) -> dict[str, Any]:
    """From a `record_backends` log's sparse notes: the mean density of the calls that ran sparse
    (None if none), how many they were and of them on reused lists, and how many calls under the plan
    ran dense (kept dense by the plan or unable to be sparse)."""
    ran_sparse = [note for note in log.sparse if note.planned and not note.reason]
    return {"density": sum(note.density for note in ran_sparse) / len(ran_sparse) if ran_sparse else None,
            "sparse_calls": len(ran_sparse), "reused_calls": sum(note.reused for note in ran_sparse),
            "dense_calls": len(log.sparse) - len(ran_sparse)}


def _steps_of_a_run(run: Callable[[], Any], clock: Any, steps: int) -> Callable[[], Any]:
    """`steps` calls of `run` as consecutive denoising steps (the install's step clock moved before
    each, counting on from 1 over every call: step 0 is a sparse plan's dense one), returning the last
    call's output. Under a plan that reuses lists every `steps` steps, each unit selects once and
    attends on the kept lists `steps - 1` times."""
    counter = itertools.count(1)

    def unit():
        out = None
        for _ in range(steps):
            clock.step = next(counter)
            out = run()
        return out

    return unit


def _counted(fn: Callable[[], Any], done: Callable[[], Any]) -> Callable[[], Any]:
    """`fn`, calling done() after each call (a progress bar's update)."""
    def call():
        try:
            return fn()
        finally:
            done()

    return call


def run_bench_forward(config: BenchForwardConfig, progress: Callable[[str], None] | None = None,
                      plan: ForwardBenchPlan | None = None) -> ForwardBenchReport:
    """Resolve `config` (unless `plan` is given), run every recipe, write the JSON if asked."""
    import torch

    from sagevideo.pipelines.forwards import build_step

    plan = plan or resolve(config)
    shape: dict[str, int] = {}

    def build():
        step = build_step(config.model, plan.device, getattr(torch, plan.dtype), **config.size())
        shape.update(tokens=step.tokens, forwards_per_step=len(step.forwards))
        return step

    from sagevideo.experiments.run_budget import LONG_S

    long = plan.estimate_s is not None and plan.estimate_s > LONG_S
    results = run_recipes(plan.recipes, build, device=plan.device, dtype=plan.dtype, repeats=config.repeats,
                          compile_backend=plan.compile_backend, backend=plan.backend, sparse=config.sparse,
                          progress=progress, bar=long)
    results += [RecipeResult(name=name, skipped=why) for name, why in plan.left_out.items()]
    report = ForwardBenchReport(date=now(), device=plan.device, dtype=plan.dtype, machine=machine(plan.device),
                                model=config.model, size=config.size(), compile_backend=plan.compile_backend,
                                repeats=config.repeats, recipes=results, **shape)
    if config.json_out is not None:
        report.write_json(config.json_out)
    if config.append_results is not None:
        report.append_results(config.append_results, f"sagevideo bench forward {config.settings_text()}".rstrip())
    return report
