"""The one generation path: a PipelineHost composed with an attention hook, generating with or
without decoding, its failpoints, and the CPU threads a run context sets."""

from __future__ import annotations

import pytest

from sagevideo.generation.generate import plan_batch
from sagevideo.host import failpoints
from sagevideo.host.pipeline_host import PipelineHost, PlannedJob, RouterAttention, RunContext
from sagevideo.jobs.specs import JobSpec
from sagevideo.pipelines.loading import resolve_model
from sagevideo.pipelines.plans import AttentionPlan
from sagevideo.pipelines.routing import AttentionRouter


class Stopped(Exception):
    pass


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    source = resolve_model("tiny")
    host = PipelineHost(RunContext(out=tmp_path_factory.mktemp("out"), source=source, device="cpu",
                                   dtype="float32", fps=8))
    yield host
    host.close()


def planned(prompt="a red panda", backend="reference", **fields):
    job = resolve_model("tiny").resolve(JobSpec(prompt=prompt, pv="fp16", **fields))
    return PlannedJob(job=job, job_id="j", output="j.mp4", label="job 1", backend=backend)


def test_generate_without_decoding_runs_the_same_denoising(host):
    from sagevideo.attention.records import record_backends

    steps = []
    with record_backends() as calls:
        result = host.generate(planned(), on_step=lambda step, total: steps.append((step, total)), decode=False)
    assert result.frames is None and result.decode_s == 0.0 and result.denoise_s > 0
    assert steps == [(1, 2), (2, 2)] and calls.summary()["counts"] == {"reference/fp16": 4}  # 2 steps x 2 layers
    assert host.generate(planned()).frames.shape == (9, 64, 64, 3)


def test_a_router_attention_hook_is_installed_for_every_job(host):
    seen = []

    class Counting(AttentionRouter):
        def __call__(self, layer, q, k, v, **kwargs):
            seen.append(layer)
            return super().__call__(layer, q, k, v, **kwargs)

    saved = host.attention
    host.attention = RouterAttention(Counting(AttentionPlan.uniform("full"), "sdpa"))
    try:
        host.close()  # the next job installs through the new hook
        host.generate(planned(steps=1), decode=False)
        host.generate(planned(backend=None, steps=1), decode=False)  # the hook decides, not the job
    finally:
        host.close()
        host.attention = saved
    assert seen.count("transformer_blocks.0.attn1") == 2  # 2 jobs x 1 step (CFG runs in one batch)


def test_the_mid_denoise_failpoint_stops_the_job_at_its_second_transformer_call(host, monkeypatch):
    def stop():
        raise Stopped

    monkeypatch.setattr(failpoints, "exit_now", stop)
    failpoints.arm("mid-denoise=STOP@1")
    hooks = dict(host.pipe.transformer._forward_pre_hooks)
    steps = []
    try:
        host.rank = 1
        with pytest.raises(Stopped):
            host.generate(planned("STOP here"), on_step=lambda step, total: steps.append(step), decode=False)
        assert steps == [1]  # step 1 ran; the second transformer call exited
        host.rank = 0
        host.generate(planned("STOP here", steps=1), decode=False)  # not this rank
    finally:
        host.rank = 0
        failpoints.disarm()
        host.close()  # sagevideo's own hooks (its step clock and guard) go with the attention
    assert dict(host.pipe.transformer._forward_pre_hooks) == hooks  # the failpoint's hook is gone again


def test_cpu_threads_of_the_run_context_reach_torch(tmp_path, monkeypatch):
    import dataclasses

    import torch

    import sagevideo.pipelines.loading as loading
    from sagevideo.host.pipeline_host import PipelineHost

    monkeypatch.setattr(loading, "load_pipeline", lambda *a, **k: object())
    ctx = plan_batch(["a cat"], out=tmp_path).context()
    before = torch.get_num_threads()
    try:
        PipelineHost(dataclasses.replace(ctx, cpu_threads=1))
        assert torch.get_num_threads() == 1
        torch.set_num_threads(before)
        PipelineHost(ctx)  # no setting: a process that has the machine to itself keeps torch's default
        assert torch.get_num_threads() == before
    finally:
        torch.set_num_threads(before)


def test_run_rank_is_the_run_as_rank_0s_result(host):
    result = host.run_rank(planned(steps=1))
    assert result.rank == 0 and result.status == "done" and result.record.done
    assert result.record.handoff.staged  # staged for the driver to commit
    (host.ctx.out / result.record.handoff.staged).unlink()


@pytest.mark.slow  # two regional compiles of the tiny model
def test_switching_attention_under_its_own_compile_recipe_says_so_once_not_compiled_before_install(tmp_path):
    """A batch with a compile recipe and jobs of two attention settings: each switch re-installs and
    torch.compile traces the blocks again. The host compiled them itself, so `install`'s warning (which
    tells a user who compiled first to install first) is replaced by one that says what helps."""
    import warnings

    import torch

    from sagevideo.host.pipeline_host import RETRACE_ON_SWITCH
    from sagevideo.jobs.recipe import Recipe
    from sagevideo.pipelines.compiled import CompiledBeforeInstallWarning

    host = PipelineHost(RunContext(out=tmp_path, source=resolve_model("tiny"), device="cpu", dtype="float32", fps=8,
                                   recipe=Recipe(compile="regional", compile_backend="eager")))
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for backend in ("reference", None, "reference", None):  # sage, full, sage, full
                host.generate(planned(backend=backend, steps=1), decode=False)
    finally:
        host.close()
        torch._dynamo.reset()
    said = [str(w.message) for w in caught if issubclass(w.category, CompiledBeforeInstallWarning)]
    assert said == [RETRACE_ON_SWITCH] and host.recipe.compiled_blocks == 2
