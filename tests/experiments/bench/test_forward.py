"""`experiments/bench/forward.py` on the CPU: recipes side by side on a tiny transformer, the JSON,
and the recipes refused (or left out of "default") before any model is built."""

import json

import pytest
import torch

from sagevideo.errors import InputError
from sagevideo.experiments.bench.forward import (
    DEFAULT_RECIPES,
    BenchForwardConfig,
    parse_recipe_name,
    resolve,
    run_bench_forward,
)


def test_recipe_names():
    assert parse_recipe_name("fp8-compile-sage") == {"linear": "fp8", "compile": "regional", "cache": "none",
                                                     "attention": "sage"}
    assert parse_recipe_name("eager-cudnn") == {"linear": "bf16", "compile": "none", "cache": "none",
                                                "attention": "cudnn"}
    with pytest.raises(ValueError, match="not \\[fp8-\\]"):
        parse_recipe_name("fast-sage")
    assert parse_recipe_name("compile-sdpa") == {"linear": "bf16", "compile": "regional", "cache": "none",
                                                 "attention": "sdpa"}
    with pytest.raises(ValueError, match="not \\[fp8-\\]"):
        parse_recipe_name("eager-sage-pyramid-broadcast")  # needs a pipeline's timestep


def test_a_recipe_name_is_a_preset_of_the_recipes_text_form_and_can_name_a_cache():
    from sagevideo.experiments.bench.forward import recipe_name_text
    from sagevideo.jobs.recipe import Recipe, parse_recipe

    assert recipe_name_text("fp8-compile-sage-first-block") == ("sage", "compile=regional,linear=fp8,cache=first-block")
    assert recipe_name_text("eager-cudnn") == ("cudnn", "")
    attention, text = recipe_name_text("eager-sdpa-taylorseer")
    assert attention == "sdpa" and parse_recipe(text) == Recipe(cache="taylorseer")
    assert parse_recipe_name("eager-sage-first-block")["cache"] == "first-block"


def test_a_cache_recipe_runs_its_forwards_in_the_caches_context():
    config = BenchForwardConfig(model="tiny-cogvideox", recipes=["eager-cudnn,eager-cudnn-first-block"], repeats=1)
    got = {r.name: r for r in run_bench_forward(config).recipes}
    cached = got["eager-cudnn-first-block"]
    assert cached.ms > 0 and cached.recipe == "first-block@0.05"
    assert cached.output_cos_vs_eager_cudnn == pytest.approx(1.0, abs=1e-6)  # the first call computes every block


def test_record_sdpa_choices_names_the_backend_torch_picks_and_changes_nothing():
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from sagevideo.experiments.bench.forward import record_sdpa_choices

    q, k, v = (torch.randn(1, 2, 8, 16, generator=torch.Generator().manual_seed(i)) for i in range(3))
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    counts: dict[str, int] = {}
    with sdpa_kernel([SDPBackend.MATH]), record_sdpa_choices(counts):
        got = torch.nn.functional.scaled_dot_product_attention(q, k, v)
        torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert counts == {"math": 2} and torch.allclose(got, want, atol=1e-6)


@pytest.mark.slow  # an end-to-end benchmark run, seconds
def test_eager_sdpa_is_a_baseline_beside_cudnn_and_records_torchs_pick(tmp_path):
    config = BenchForwardConfig(model="tiny-cogvideox", recipes=["eager-cudnn,eager-sdpa,eager-sage,compile-sdpa"],
                                repeats=1)
    report = run_bench_forward(config)
    got = {r.name: r for r in report.recipes}
    sdpa = got["eager-sdpa"]
    assert sdpa.x_eager_sdpa == 1.0 and got["eager-sage"].x_eager_sdpa == pytest.approx(sdpa.ms / got["eager-sage"].ms)
    assert sum(sdpa.sdpa_backends.values()) == 2 and sum(got["eager-cudnn"].sdpa_backends.values()) == 2  # 2 layers
    assert got["eager-sage"].sdpa_backends == {} and got["compile-sdpa"].sdpa_backends == {}  # not recorded there
    assert sdpa.output_cos_vs_eager_cudnn == pytest.approx(1.0, abs=1e-9)  # the CPU has one SDPA choice
    header, *rows = report.table().splitlines()[1:]
    assert "x eager SDPA" in header and "stock SDPA {" in rows[1]
    assert "eager SDPA (torch's pick)" in report.summary()


@pytest.mark.slow  # an end-to-end benchmark run, seconds
def test_recipes_run_side_by_side_with_ratios_from_their_times(tmp_path):
    path = tmp_path / "bench.json"
    # eager cuDNN not first: the recipes before it get their cosine once it has run
    config = BenchForwardConfig(model="tiny-cogvideox", recipes=["eager-sage,eager-cudnn", "compile-cudnn"],
                                repeats=1, json_out=path)
    lines = []
    report = run_bench_forward(config, progress=lines.append)
    assert [line.split(":")[0] for line in lines] == ["eager-sage", "eager-cudnn", "compile-cudnn"]
    data = json.loads(path.read_text())
    assert data["schema"] == "sagevideo.bench.forward" and data["version"] == 1
    assert (data["device"], data["compile_backend"], data["forwards_per_step"]) == ("cpu", "eager", 1)
    got = {r["name"]: r for r in data["recipes"]}
    eager, compiled, sage = got["eager-cudnn"], got["compile-cudnn"], got["eager-sage"]
    for r in got.values():
        assert r["x_eager_cudnn"] == pytest.approx(eager["ms"] / r["ms"])
        assert r["x_compile_cudnn"] == pytest.approx(compiled["ms"] / r["ms"])
        assert r["first_call_s"] > 0
    assert eager["x_eager_cudnn"] == 1.0 and eager["output_cos_vs_eager_cudnn"] == pytest.approx(1.0, abs=1e-12)
    assert compiled["output_cos_vs_eager_cudnn"] == pytest.approx(1.0, abs=1e-6)  # same model, eager backend
    assert compiled["compiled_blocks"] == 2 and compiled["recipe"] == "regional/eager"
    # two layers x (the first call, the warm-up, one timed call); stock SDPA records nothing
    assert sage["backends"] == {"reference/fp16": 2 * 3} and eager["backends"] == {}
    assert 0.99 < sage["output_cos_vs_eager_cudnn"] < 1.0 + 1e-9
    assert report.summary().startswith("fastest ")
    assert report.table().splitlines()[-1].startswith("compile-cudnn")


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU's refusals")
def test_default_leaves_out_what_the_cpu_cannot_run_and_a_named_one_is_refused():
    plan = resolve(BenchForwardConfig(recipes=["default"]))
    assert plan.recipes == [n for n in DEFAULT_RECIPES if not n.startswith("fp8-")]
    assert "float8 linears need a CUDA GPU" in plan.left_out["fp8-compile-sage"]
    assert (plan.compile_backend, plan.backend, plan.dtype) == ("eager", "reference", "float32")
    with pytest.raises(InputError, match="--recipes fp8-eager-sage: float8 linears need a CUDA GPU"):
        resolve(BenchForwardConfig(recipes=["fp8-eager-sage"]))


@pytest.mark.parametrize(("recipes", "message"), [
    (["eager-sage,bogus"], "--recipes bogus: 'bogus' is not"),
    ([","], "--recipes: none named"),
])
def test_bad_recipe_names_are_refused(recipes, message):
    with pytest.raises(InputError, match=message):
        resolve(BenchForwardConfig(recipes=recipes))


def test_sparse_makes_the_sage_recipes_block_sparse_and_records_their_density(tmp_path):
    """A sparse step as `generate --sparse` runs it (static windows: random weights leave dynamic
    selection nothing to drop); the stock recipe is untouched."""
    from sagevideo.experiments.bench.results import Run

    config = BenchForwardConfig.build(model="tiny-wan", recipes=["eager-cudnn", "eager-sage"], sparse="static:0.3",
                                      repeats=1, frames=33, resolution="128x128")
    report = run_bench_forward(config)
    stock, sage = report.recipes
    assert (stock.sparse, stock.density) == (None, None)
    assert sage.sparse == "static:0.3" and 0.2 < sage.density < 0.4  # of the sparse calls only
    # Of each forward's four calls (two blocks' self- and cross-attention) only the second block's
    # self-attention is sparse: the first layer stays dense, cross-attention always is.
    calls = sum(sage.backends.values())
    assert (sage.sparse_calls, sage.dense_calls) == (calls // 4, calls - calls // 4)
    assert sage.output_cos_vs_eager_cudnn > 0.99
    assert f"sparse static:0.3, density {sage.density:.3f} over {calls // 4} sparse calls, " in report.table()
    run = Run(bench="bench_forward", gpu="cpu", commit=None, date="2026-01-01", source="test")
    report.result_rows(run)
    rows = {(r.variant, r.metric): r.value for r in run.rows}
    assert rows["recipe-eager-sage[sparse=static:0.3]", "density"] == pytest.approx(sage.density)
    assert ("recipe-eager-cudnn", "density") not in rows


@pytest.mark.parametrize(("recipes", "message"), [
    (["eager-cudnn"], "--sparse dynamic:0.15: applies to sage recipes, none named; e.g. --recipes eager-sage"),
])
def test_sparse_is_refused_where_it_cannot_run_before_any_model_is_built(recipes, message):
    with pytest.raises(InputError, match=message):
        resolve(BenchForwardConfig.build(model="tiny-wan", recipes=recipes, sparse="dynamic:0.15"))


def test_a_dynamic_recipe_that_skipped_no_tile_is_said_with_the_static_alternative():
    """On random weights the dynamic selection keeps every tile: the table says so, not only 1.000."""
    from sagevideo.experiments.bench.forward import RecipeResult, recipe_table

    dynamic = RecipeResult(name="compile-sage", ms=10.0, sparse="dynamic:0.15", density=0.99996)
    static = RecipeResult(name="eager-sage", ms=9.0, sparse="static:0.15", density=1.0)
    note = recipe_table([dynamic, static])[-1]
    assert note.startswith("note: compile-sage skipped no tile (density 1.000)") and "--sparse static:D" in note
    assert not recipe_table([dynamic.model_copy(update={"density": 0.9})])[-1].startswith("note:")


def test_sparse_takes_compiled_sage_recipes():
    """The selection reads nothing on the host, so compiled recipes run sparse in whole graphs."""
    resolve(BenchForwardConfig.build(model="tiny-wan", recipes=["eager-sage", "compile-sage"], sparse="dynamic:0.15"))


def test_each_recipes_model_is_released_before_the_next_is_built():
    """Only one model at a time: two real-size ones do not fit an 80 GB card."""
    import weakref

    from sagevideo.experiments.bench.forward import run_recipes
    from sagevideo.pipelines.forwards import build_step

    built, alive_at_build = [], []

    def build():
        alive_at_build.append(sum(ref() is not None for ref in built))
        step = build_step("tiny-cogvideox", "cpu", torch.float32)
        built.append(weakref.ref(step.model))
        return step

    run_recipes(["eager-cudnn", "eager-sage", "eager-cudnn"], build, device="cpu", dtype="float32", repeats=1,
                compile_backend="eager", backend="reference")
    assert alive_at_build == [0, 0, 0]


def test_a_sparse_setting_with_reuse_times_a_run_of_steps_whose_later_calls_reuse_the_lists():
    """dynamic:0.3:reuse2: each timed unit is two steps (the clock moved before each forward), the first
    selecting, the second on the kept lists; ms is the mean step."""
    config = BenchForwardConfig.build(model="tiny-wan", recipes=["eager-sage"], sparse="dynamic:0.3:reuse2",
                                      repeats=2, frames=33, resolution="128x128")
    report = run_bench_forward(config)
    (sage,) = report.recipes
    # first call, warm-up and 2 timed: 4 units of 2 steps of 2 forwards (guidance), one sparse layer each;
    # the second step of each unit reuses
    assert report.forwards_per_step == 2
    assert (sage.sparse_calls, sage.reused_calls) == (16, 8) and sage.ms > 0
    assert "over 16 sparse calls (8 on reused lists)" in report.table()
