"""The recipe on a tiny pipeline: refused before loading where it cannot run, diffusers' cache
hooks registered and their skipped forwards counted, regional compile equal to eager and
composed with install (every attention call still recorded)."""

from __future__ import annotations

import pytest
import torch

from sagevideo.attention.records import record_backends
from sagevideo.errors import InputError
from sagevideo.generation.plan import plan_batch
from sagevideo.jobs.recipe import Recipe
from sagevideo.pipelines.install import install
from sagevideo.pipelines.loading import resolve_model
from sagevideo.pipelines.recipe import apply_recipe, recipe_problems, transformer_blocks


def fresh_pipe():
    """A tiny CogVideoX pipeline of its own (the recipe changes the model for good)."""
    from sagevideo.pipelines.cogvideox.tiny import tiny_pipeline

    torch.manual_seed(0)
    pipe = tiny_pipeline()
    pipe.set_progress_bar_config(disable=True)
    return pipe


def is_compiled(block) -> bool:
    """Its own forward compiled, bare or under diffusers' cache hooks (the forward the first hook
    wraps)."""
    if hasattr(block.forward, "_torchdynamo_orig_callable"):
        return True
    registry = getattr(block, "_diffusers_hook", None)
    wrapped = [ref.original_forward for ref in (registry._fn_refs if registry is not None else [])]
    return any(hasattr(fn, "_torchdynamo_orig_callable") for fn in wrapped)


def forward(transformer):
    """One transformer forward on fixed random inputs (tiny config: (1, 3, 4, 8, 8) latents)."""
    config = transformer.config
    g = torch.Generator().manual_seed(1)
    dtype = transformer.dtype
    latents = torch.randn(1, 3, config.in_channels, 8, 8, generator=g).to(dtype)
    text = torch.randn(1, config.max_text_seq_length, config.text_embed_dim, generator=g).to(dtype)
    with torch.no_grad():
        return transformer(hidden_states=latents, encoder_hidden_states=text, timestep=torch.tensor([500]),
                           return_dict=False)[0]


def test_fp8_linears_are_refused_on_cpu_before_loading(tmp_path, no_model_load):
    with pytest.raises(InputError, match=r"--linear fp8: float8 linears need a CUDA GPU .*not cpu"):
        plan_batch("a cat", out=tmp_path, device="cpu", linear="fp8")


def test_unknown_cache_and_family_without_cache_support_are_refused(tmp_path, no_model_load):
    with pytest.raises(InputError, match="--cache bogus"):
        plan_batch("a cat", out=tmp_path, device="cpu", cache="bogus")
    with pytest.raises(InputError, match=r"Open-Sora 2.0 transformer does not take this diffusers cache \(it takes: "
                       r"first-block, taylorseer\)"):
        plan_batch("a cat", out=tmp_path, device="cpu", model="tiny-opensora", cache="pyramid-broadcast")


def test_cache_with_sequence_parallel_ranks_is_refused():
    problems = recipe_problems(Recipe(cache="first-block"), resolve_model("tiny"), "cpu", "float32", gpus_per_job=2)
    assert problems and "each rank decide on its own shard" in problems[0][1]
    assert recipe_problems(Recipe(compile="regional", compile_backend="eager"), resolve_model("tiny"), "cpu",
                           "float32") == []


def test_first_block_cache_registers_diffusers_hooks_and_counts_skipped_forwards():
    pipe = fresh_pipe()
    applied = apply_recipe(pipe, Recipe(cache="first-block", cache_threshold=5.0))  # a high threshold skips
    assert pipe.transformer.is_cache_enabled
    from sagevideo.pipelines.runner import run_job

    source = resolve_model("tiny")
    from sagevideo.jobs.specs import JobSpec

    job = source.resolve(JobSpec(prompt="a cat", steps=4))
    applied.start_job(pipe.transformer)
    run_job(pipe, job, text_tokens=source.text_tokens, family=source.model_family, decode=False)
    record = applied.record()
    assert record["cache_forwards"] == 4  # one decision per denoising step (CFG batched)
    assert record["cache_skipped"] == 3  # every step after the first reuses the cached residual
    applied.start_job(pipe.transformer)
    assert applied.record()["cache_skipped"] == 0


def test_regional_compile_equals_eager_and_keeps_every_attention_record():
    pipe = fresh_pipe()
    handle = install(pipe, None, pv="fp16", backend="reference")
    with record_backends() as eager_calls:
        eager = forward(pipe.transformer)
    applied = apply_recipe(pipe, Recipe(compile="regional", compile_backend="eager"))
    assert applied.compiled_blocks == len(transformer_blocks(pipe.transformer)) == 2
    assert applied.compile_via == "block forwards"  # CogVideoX declares no _repeated_blocks in diffusers 0.42
    with record_backends() as compiled_calls:
        compiled = forward(pipe.transformer)
    handle.remove()
    torch.testing.assert_close(compiled, eager, rtol=1e-4, atol=1e-4)
    assert compiled_calls.summary()["counts"] == eager_calls.summary()["counts"] != {}
    assert all(is_compiled(block) for _, block in transformer_blocks(pipe.transformer))


def _cached_latents(recipe: Recipe) -> tuple[torch.Tensor, dict, dict]:
    """8 steps of the tiny pipeline under `recipe`, from a fresh Dynamo: (latents, the recipe's
    record, Dynamo's counters: graphs compiled and graph breaks)."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    pipe = fresh_pipe()
    applied = apply_recipe(pipe, recipe)
    applied.start_job(pipe.transformer)
    latents = pipe("a fox", num_frames=9, height=64, width=64, num_inference_steps=8, output_type="latent",
                   generator=torch.Generator().manual_seed(0)).frames
    found = {"unique_graphs": counters["stats"]["unique_graphs"], "graph_breaks": sum(counters["graph_break"].values())}
    return latents, applied.record(), found


def test_regional_compile_is_one_graph_for_every_block_and_the_same_latents():
    """CogVideoX's first block gets a strided view of the joint sequence; its inputs made contiguous
    outside the compiled forward, it shares the later blocks' graph (two graphs before: a recompile
    on a stride guard, in every GPU run's log)."""
    compiled, _, dynamo = _cached_latents(Recipe(compile="regional", compile_backend="eager"))
    eager, _, _ = _cached_latents(Recipe())
    assert dynamo == {"unique_graphs": 1, "graph_breaks": 0}
    torch.testing.assert_close(compiled, eager, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("model", ["tiny-wan", "tiny-hunyuanvideo", "tiny-opensora"])
def test_every_family_compiles_one_graph_per_block_class(model):
    """HunyuanVideo's single blocks got a batch-1 view ("contiguous", its batch stride odd) and
    compiled a second graph; now each compiled block class is one graph."""
    from torch._dynamo.utils import counters

    from sagevideo.jobs.specs import JobSpec
    from sagevideo.pipelines.runner import run_job

    torch._dynamo.reset()
    counters.clear()
    source = resolve_model(model)
    pipe = source.model_family.load(source, "cpu", torch.float32)
    pipe.set_progress_bar_config(disable=True)
    applied = apply_recipe(pipe, Recipe(compile="regional", compile_backend="eager"))
    classes = {type(m) for m in pipe.transformer.modules() if hasattr(m.forward, "_torchdynamo_orig_callable")}
    run_job(pipe, source.resolve(JobSpec(prompt="a cat", steps=2)), text_tokens=source.text_tokens,
            family=source.model_family, decode=False)
    assert applied.compiled_blocks >= 2 and len(classes) >= 1
    assert counters["stats"]["unique_graphs"] == len(classes)


@pytest.mark.parametrize("batch", [2, 1])  # batch 1: the view is "contiguous", its batch stride still odd
def test_contiguous_inputs_copies_views_to_row_major_strides_only(batch):
    from sagevideo.pipelines.recipe import contiguous_inputs, row_major_strides

    joint = torch.randn(batch, 10, 4)
    view, dense, other = joint[:, 3:], torch.randn(2, 3), object()
    assert view.stride() != row_major_strides(view.shape) == torch.empty(view.shape).stride()
    args, kwargs = contiguous_inputs(None, (view, 1), {"encoder_hidden_states": dense, "extra": other})
    assert args[0].stride() == (28, 4, 1) and torch.equal(args[0], view) and args[1] == 1
    assert kwargs["encoder_hidden_states"] is dense and kwargs["extra"] is other
    assert row_major_strides((3, 0, 2)) == torch.empty(3, 0, 2).stride()


@pytest.mark.slow  # torch.compile (regional, eager backend) of the tiny model under the cache
def test_first_block_cache_under_regional_compile_keeps_its_hooks_out_of_the_compiled_blocks():
    # Compiled with the block, the cache's per-step decision was traced: graph breaks in the first
    # block and a recompile per change of the cache's state (on the GPU: blocks left eager, slower).
    compiled_cache = Recipe(compile="regional", compile_backend="eager", cache="first-block", cache_threshold=0.3)
    latents, record, dynamo = _cached_latents(compiled_cache)
    eager_latents, eager_record, _ = _cached_latents(Recipe(cache="first-block", cache_threshold=0.3))
    _, _, no_cache = _cached_latents(Recipe(compile="regional", compile_backend="eager"))
    assert 0 < record["cache_skipped"] < record["cache_forwards"] == 8  # both of the hook's paths ran
    assert dynamo == no_cache and dynamo["graph_breaks"] == 0  # the graphs the blocks compile to without a cache
    assert record["compiled_blocks"] == 2 and record["cache_skipped"] == eager_record["cache_skipped"]
    torch.testing.assert_close(latents, eager_latents)


def test_pyramid_broadcast_with_compile_is_refused_before_loading(tmp_path, no_model_load):
    with pytest.raises(InputError, match=r"--cache pyramid-broadcast: does not compose with --compile regional"):
        plan_batch("a cat", out=tmp_path, device="cpu", cache="pyramid-broadcast", compile="regional",
                   compile_backend="eager")


@pytest.fixture
def cache_env(monkeypatch, tmp_path):
    """No compile-cache variable set, HOME in tmp_path; a file `blocker` to point them at."""
    for name in ("SAGEVIDEO_COMPILE_CACHE", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    blocker = tmp_path / "blocker"
    blocker.write_text("a file, not a folder")
    return blocker


@pytest.mark.parametrize(
    "variable, value, says",
    [
        ("SAGEVIDEO_COMPILE_CACHE", "{blocker}", "the compile cache {blocker}/inductor (SAGEVIDEO_COMPILE_CACHE="
         "{blocker}) cannot be written ({blocker} is a file, not a folder); set SAGEVIDEO_COMPILE_CACHE to a "
         "writable folder"),
        ("HOME", "{blocker}", "the compile cache {blocker}/.cache/sagevideo/compile/inductor (the default under HOME, "
         "~/.cache/sagevideo/compile) cannot be written ({blocker} is a file, not a folder); set "
         "SAGEVIDEO_COMPILE_CACHE to a writable folder"),
        ("TORCHINDUCTOR_CACHE_DIR", "{blocker}", "the compile cache {blocker} (TORCHINDUCTOR_CACHE_DIR={blocker}) "
         "cannot be written (it is a file, not a folder); set TORCHINDUCTOR_CACHE_DIR to a writable folder, "
         "or unset it"),
    ],
)
def test_a_compile_cache_that_cannot_be_written_is_refused_before_loading(cache_env, monkeypatch, tmp_path,
                                                                          no_model_load, variable, value, says):
    """Each job used to load the model and then fail with a raw NotADirectoryError at its first
    compiled step; now the batch is refused at once, naming the variable to set."""
    monkeypatch.setenv(variable, value.format(blocker=cache_env))
    with pytest.raises(InputError) as refused:
        plan_batch("a cat", out=tmp_path / "out", device="cpu", compile="regional", compile_backend="eager")
    assert str(refused.value) == f"--compile regional: {says.format(blocker=cache_env)}"


def test_a_writable_compile_cache_is_created_and_triton_is_asked_only_on_cuda(cache_env, monkeypatch, tmp_path):
    from sagevideo.pipelines.recipe import compile_cache_problems

    monkeypatch.setenv("TRITON_CACHE_DIR", str(cache_env))  # Triton compiles nothing on CPU
    assert compile_cache_problems("cpu") == []
    assert (tmp_path / "home" / ".cache" / "sagevideo" / "compile" / "inductor").is_dir()
    (problem,) = compile_cache_problems("cuda")
    assert problem.startswith(f"the compile cache {cache_env} (TRITON_CACHE_DIR={cache_env}) cannot be written")


def test_a_bad_inductor_folder_is_refused_without_compile_too(cache_env, monkeypatch, tmp_path, no_model_load):
    """torch creates TORCHINDUCTOR_CACHE_DIR when torch._dynamo is imported (diffusers imports it),
    so a bad one would be a traceback in every run; SAGEVIDEO_COMPILE_CACHE matters only to --compile."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(cache_env))
    with pytest.raises(InputError, match=r"^the compile cache .* set TORCHINDUCTOR_CACHE_DIR to a writable folder"):
        plan_batch("a cat", out=tmp_path / "out", device="cpu")
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR")
    monkeypatch.setenv("SAGEVIDEO_COMPILE_CACHE", str(cache_env))
    assert plan_batch("a cat", out=tmp_path / "out", device="cpu").jobs


def test_a_keep_pattern_that_names_no_layer_is_an_error(monkeypatch):
    pytest.importorskip("torchao")
    with pytest.raises(ValueError, match="--linear-keep nothing.*names no linear"):
        apply_recipe(fresh_pipe(), Recipe(linear="fp8", linear_keep=["nothing.*"]))


def test_fp8_linears_leave_inductors_settings_as_the_user_set_them(monkeypatch):
    """torchao's float8 config turns on coordinate-descent tuning for the whole process by default:
    the first call of each compiled FP8 block then spent minutes tuning Triton configs one by one.
    torchao's real quantize_ runs here, its check for an sm89+ GPU stood in for."""
    pytest.importorskip("torchao")
    import torch._inductor.config as inductor_config
    import torchao.quantization.quant_api as quant_api

    monkeypatch.setattr(quant_api, "_check_hardware_support", lambda granularity: None)
    # Inductor's config module is patched through its own API (monkeypatch's undo deletes its entries).
    with inductor_config.patch(coordinate_descent_tuning=False, coordinate_descent_check_all_directions=False):
        applied = apply_recipe(fresh_pipe().to(torch.bfloat16), Recipe(linear="fp8"))  # PerRow takes bf16 weights
        assert applied.fp8_layers
        assert inductor_config.coordinate_descent_tuning is False
        assert inductor_config.coordinate_descent_check_all_directions is False


def test_every_denoiser_gets_the_recipe_and_is_reset_per_job():
    """Wan 2.2's two denoisers: both compiled, both cached; before, only `transformer` was, and the
    record claimed the recipe for the whole pipeline."""
    from sagevideo.jobs.specs import JobSpec
    from sagevideo.pipelines.runner import run_job

    source = resolve_model("tiny-wan22")
    pipe = source.model_family.load(source, "cpu", torch.float32)
    pipe.set_progress_bar_config(disable=True)
    blocks = [len(transformer_blocks(t)) for t in (pipe.transformer, pipe.transformer_2)]
    applied = apply_recipe(pipe, Recipe(compile="regional", compile_backend="eager", cache="first-block",
                                        cache_threshold=5.0))
    assert pipe.transformer.is_cache_enabled and pipe.transformer_2.is_cache_enabled
    assert applied.compiled_blocks == sum(blocks) and all(b >= 2 for b in blocks)
    compiled = [block for t in (pipe.transformer, pipe.transformer_2) for _, block in transformer_blocks(t)]
    assert all(is_compiled(block) for block in compiled)
    job = source.resolve(JobSpec(prompt="a cat", steps=4))  # boundary 0.875: the steps split over both denoisers
    applied.start_job()
    run_job(pipe, job, text_tokens=source.text_tokens, family=source.model_family, decode=False)
    assert applied.record()["cache_forwards"] == 8  # two guidance branches a step, each its own forward


@pytest.mark.slow
def test_the_record_says_whether_the_compile_came_from_the_persistent_cache(tmp_path, monkeypatch):
    """A cold start misses Inductor's FX-graph cache, a second start (Dynamo reset, as in a new
    process) hits it; the job's record counts both since the job started."""
    import torch._inductor.config as inductor_config

    from sagevideo.pipelines.recipe import AppliedRecipe, inductor_problem

    if inductor_problem("cpu"):
        pytest.skip(inductor_problem("cpu"))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    block = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU())

    def job() -> dict[str, int]:
        torch._dynamo.reset()
        applied = AppliedRecipe(Recipe(compile="regional"))
        applied.start_job()
        with torch.no_grad():
            torch.compile(block, backend="inductor")(torch.ones(2, 8))
        return applied.record()["compile_cache_lookups"]

    with inductor_config.patch(fx_graph_cache=True):
        cold, warm = job(), job()
    assert (cold["fxgraph_cache_miss"], cold["fxgraph_cache_hit"]) == (1, 0)
    assert (warm["fxgraph_cache_miss"], warm["fxgraph_cache_hit"]) == (0, 1)
    assert AppliedRecipe(Recipe()).record()["compile_cache_lookups"] is None  # nothing compiled: not counted


@pytest.fixture
def fp8_on_cpu(monkeypatch):
    """torchao's float8 linears on the CPU (torch has a CPU float8 GEMM): its sm89+ check and
    the recipe's machine check stood in for."""
    pytest.importorskip("torchao")
    import torchao.quantization.quant_api as quant_api

    import sagevideo.pipelines.recipe.apply as recipe_module

    monkeypatch.setattr(quant_api, "_check_hardware_support", lambda granularity: None)
    monkeypatch.setattr(recipe_module, "fp8_linear_problem", lambda device, dtype: None)


def weight_kinds_per_forward(transformer) -> list[str]:
    """'bf16' or 'fp8' for each later forward of the transformer (a hook outside the compiled
    blocks), read off its first float8 linear."""
    linear = next(m for m in transformer.modules() if isinstance(m, torch.nn.Linear) and is_fp8(m.weight))
    kinds: list[str] = []
    transformer.register_forward_pre_hook(lambda m, args: kinds.append("fp8" if is_fp8(linear.weight) else "bf16"))
    return kinds


def is_fp8(weight) -> bool:
    return "Float8" in type(weight).__name__


def run_steps(pipe, applied, steps: int):
    from sagevideo.jobs.specs import JobSpec
    from sagevideo.pipelines.runner import run_job

    source = resolve_model("tiny")
    applied.start_job(steps=steps)
    job = source.resolve(JobSpec(prompt="a cat", steps=steps))
    return run_job(pipe, job, text_tokens=source.text_tokens, decode=False, on_step=applied.on_step)


@pytest.mark.slow  # two regional compiles of the tiny model in bf16 with fp8 linears
def test_bf16_steps_run_those_steps_with_the_bf16_weights_and_compile_once_more(fp8_on_cpu):
    from torch._dynamo.utils import counters

    graphs = {}
    for steps_in_bf16 in ([], [0, -1]):
        torch._dynamo.reset()
        counters.clear()
        pipe = fresh_pipe().to(torch.bfloat16)
        applied = apply_recipe(pipe, Recipe(linear="fp8", linear_bf16_steps=steps_in_bf16, compile="regional",
                                            compile_backend="eager"))
        kinds = weight_kinds_per_forward(pipe.transformer)
        if steps_in_bf16:
            run_steps(pipe, applied, 4)
            assert kinds == ["bf16", "fp8", "fp8", "bf16"]  # one forward a step (CFG batched)
            assert applied.record()["bf16_steps_ran"] == [0, 3]
        else:
            applied.start_job()
            from sagevideo.jobs.specs import JobSpec
            from sagevideo.pipelines.runner import run_job

            source = resolve_model("tiny")
            run_job(pipe, source.resolve(JobSpec(prompt="a cat", steps=4)), text_tokens=source.text_tokens,
                    decode=False)
            assert kinds == ["fp8"] * 4
        graphs[bool(steps_in_bf16)] = counters["stats"]["unique_graphs"]
        assert not counters["graph_break"]
    assert graphs[True] == 2 * graphs[False]  # each graph once more, for the bf16 weights; no recompile per step


@pytest.mark.slow  # three bf16 videos of the tiny model, fp8 linears emulated on CPU
def test_bf16_steps_for_every_step_give_the_bf16_video_and_fewer_do_not(fp8_on_cpu):
    def video(recipe: Recipe):
        from sagevideo.jobs.specs import JobSpec
        from sagevideo.pipelines.runner import run_job

        pipe = fresh_pipe().to(torch.bfloat16)
        applied = apply_recipe(pipe, recipe)
        applied.start_job(steps=3)
        source = resolve_model("tiny")
        job = source.resolve(JobSpec(prompt="a cat", steps=3))
        frames = run_job(pipe, job, text_tokens=source.text_tokens, on_step=applied.on_step).frames
        return frames, applied.record()

    bf16, _ = video(Recipe())
    every, record = video(Recipe(linear="fp8", linear_bf16_steps=[0, 1, 2]))
    assert record["bf16_steps_ran"] == [0, 1, 2] and (every == bf16).all()
    first, record = video(Recipe(linear="fp8", linear_bf16_steps=[0]))
    assert record["bf16_steps_ran"] == [0] and not (first == bf16).all()  # steps 1 and 2 ran float8


def test_bf16_steps_where_every_linear_is_kept_in_bf16_have_nothing_to_swap(fp8_on_cpu):
    pipe = fresh_pipe().to(torch.bfloat16)
    applied = apply_recipe(pipe, Recipe(linear="fp8", linear_keep=["*"], linear_bf16_steps=[0]))
    assert applied.fp8_layers == [] and applied.bf16_steps is None and "bf16_steps_ran" not in applied.record()
    assert torch.isfinite(forward(pipe.transformer)).all()  # no job's steps needed: every step is bf16


def test_the_denoiser_refuses_to_run_bf16_steps_before_a_job_says_its_steps(fp8_on_cpu):
    pipe = fresh_pipe().to(torch.bfloat16)
    apply_recipe(pipe, Recipe(linear="fp8", linear_bf16_steps=[0]))
    with pytest.raises(RuntimeError, match="--linear-bf16-steps: the denoiser ran before a job said its steps"):
        forward(pipe.transformer)


def test_bf16_steps_a_job_does_not_have_are_refused_before_loading(tmp_path, no_model_load):
    with pytest.raises(InputError, match=r"--linear-bf16-steps 0,9: step 9 is not one of the job's 4 steps .*job 1 "
                       r"has 4"):
        plan_batch("a cat", out=tmp_path, device="cpu", linear="fp8", linear_bf16_steps=[0, 9], steps=4)
    with pytest.raises(InputError, match="--linear-bf16-steps 0: runs steps in bf16 only with --linear fp8"):
        plan_batch("a cat", out=tmp_path, device="cpu", linear_bf16_steps=[0])


@pytest.mark.slow  # an end-to-end batch of two bf16 jobs with fp8 linears emulated on CPU
def test_generate_runs_the_bf16_steps_on_every_job_and_records_them(tmp_path, fp8_on_cpu):
    import sagevideo

    records = sagevideo.generate(["a cat", "a dog"], out=tmp_path, device="cpu", dtype="bfloat16", steps=3,
                                 linear="fp8", linear_bf16_steps=[-1], progress=False)
    assert [r["status"] for r in records] == ["done", "done"], [r["error"] for r in records]
    assert [r["recipe"]["bf16_steps_ran"] for r in records] == [[2], [2]]  # each job from its own step 0
    assert records[0]["recipe"]["linear_bf16_steps"] == [-1] and records[0]["recipe"]["fp8_layers"] > 0


@pytest.mark.slow
def test_graphs_with_sagevideo_attention_load_from_the_compile_cache_and_still_record(tmp_path, monkeypatch):
    """The record op's with_effects operator made Inductor's FX-graph cache refuse every graph with
    sagevideo attention ('bypass'), so each process compiled them again. `use_compile_cache` marks
    it cacheable: a second start (Dynamo reset) loads the graph, and the loaded graph still says
    which kernel ran, each call."""
    import torch._inductor.config as inductor_config

    from sagevideo.attention.functional import sageattn
    from sagevideo.attention.records import WITH_EFFECTS
    from sagevideo.pipelines.recipe import compile_cache_counts, inductor_problem, use_compile_cache

    if inductor_problem("cpu"):
        pytest.skip(inductor_problem("cpu"))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))  # set by the user: kept
    q, k, v = (torch.randn(1, 2, 64, 32, generator=torch.Generator().manual_seed(i)) for i in range(3))

    def attend(q, k, v):
        return sageattn(q, k, v, backend="reference") * 2

    def start() -> tuple[dict[str, int], dict[str, int]]:
        torch._dynamo.reset()
        before = compile_cache_counts()
        with record_backends() as log:
            torch.compile(attend, backend="inductor")(q, k, v)
        return {n: c - before[n] for n, c in compile_cache_counts().items() if c - before[n]}, dict(log.counts)

    with inductor_config.patch(fx_graph_cache=False, unsafe_marked_cacheable_functions={}):
        assert use_compile_cache()["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "inductor")
        assert inductor_config.fx_graph_cache and WITH_EFFECTS in inductor_config.unsafe_marked_cacheable_functions
        (cold, cold_calls), (warm, warm_calls) = start(), start()
    assert cold.get("fxgraph_cache_miss") == 1 and "fxgraph_cache_bypass" not in cold
    assert warm.get("fxgraph_cache_hit") == 1 and "fxgraph_cache_miss" not in warm
    assert cold_calls == warm_calls == {"reference/fp16": 1}


@pytest.mark.gpu
def test_fp8_with_bf16_steps_under_inductor_on_gpu():
    """The real thing on an sm89+ GPU: torchao's float8 GEMMs, Inductor, sagevideo's Triton kernels;
    steps 0 and -1 with the bf16 weights, a finite video, every attention call on a kernel."""
    from sagevideo.choices import has_fp8_tensor_cores

    if not has_fp8_tensor_cores("cuda"):
        pytest.skip("needs FP8 tensor cores (sm89+)")
    from sagevideo.jobs.specs import JobSpec
    from sagevideo.pipelines.runner import run_job

    pipe = fresh_pipe().to("cuda", torch.bfloat16)
    install(pipe, backend="triton")
    applied = apply_recipe(pipe, Recipe(linear="fp8", linear_bf16_steps=[0, -1], compile="regional"))
    kinds = weight_kinds_per_forward(pipe.transformer)
    source = resolve_model("tiny")
    applied.start_job(steps=4)
    with record_backends() as log:
        frames = run_job(pipe, source.resolve(JobSpec(prompt="a cat", steps=4)), text_tokens=source.text_tokens,
                         on_step=applied.on_step).frames
    assert kinds == ["bf16", "fp8", "fp8", "bf16"] and applied.record()["bf16_steps_ran"] == [0, 3]
    assert frames is not None and frames.std() > 0
    assert log.counts and all(label.startswith(("triton/", "gluon/")) for label in log.counts), dict(log.counts)
