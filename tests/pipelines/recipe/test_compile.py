"""pipelines/recipe/compile.py: regional compile equal to eager and composed with install (every attention call
still recorded), one graph per block class on every family, inputs copied to row-major strides outside the
compiled code."""

from __future__ import annotations

import pytest
import torch

from sagevideo.attention.records import record_backends
from sagevideo.jobs.recipe import Recipe
from sagevideo.pipelines.install import install
from sagevideo.pipelines.loading import resolve_model
from sagevideo.pipelines.recipe import apply_recipe, transformer_blocks
from tests.helpers.recipe import cached_latents, forward, fresh_pipe, is_compiled

pytestmark = pytest.mark.slow  # torch.compile


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


def test_regional_compile_is_one_graph_for_every_block_and_the_same_latents():
    """CogVideoX's first block gets a strided view of the joint sequence; its inputs made contiguous
    outside the compiled forward, it shares the later blocks' graph (two graphs before: a recompile
    on a stride guard, in every GPU run's log)."""
    compiled, _, dynamo = cached_latents(Recipe(compile="regional", compile_backend="eager"))
    eager, _, _ = cached_latents(Recipe())
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

