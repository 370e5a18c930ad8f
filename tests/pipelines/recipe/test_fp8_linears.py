"""pipelines/recipe/fp8_linears.py: torchao's float8 linears (its real quantize_ on CPU, its GPU check stood in
for), refused where they cannot run, Inductor's settings left alone, and the bf16 steps swapped in between steps."""

from __future__ import annotations

import pytest
import torch

from sagevideo.attention.records import record_backends
from sagevideo.errors import InputError
from sagevideo.generation.plan import plan_batch
from sagevideo.jobs.recipe import Recipe
from sagevideo.pipelines.install import install
from sagevideo.pipelines.loading import resolve_model
from sagevideo.pipelines.recipe import apply_recipe
from tests.helpers.recipe import forward, fresh_pipe, run_steps, weight_kinds_per_forward


def test_fp8_linears_are_refused_on_cpu_before_loading(tmp_path, no_model_load):
    with pytest.raises(InputError, match=r"--linear fp8: float8 linears need a CUDA GPU .*not cpu"):
        plan_batch("a cat", out=tmp_path, device="cpu", linear="fp8")


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

