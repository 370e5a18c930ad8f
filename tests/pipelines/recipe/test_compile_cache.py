"""pipelines/recipe/compile_cache.py: a compile cache that cannot be written is refused before loading, naming the
variable to set; the record says whether compiled code came from the persistent cache, with sagevideo attention
in the graphs too."""

from __future__ import annotations

import pytest
import torch

from sagevideo.attention.records import record_backends
from sagevideo.errors import InputError
from sagevideo.generation.plan import plan_batch
from sagevideo.jobs.recipe import Recipe


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

