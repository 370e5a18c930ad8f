"""A block-sparse run of a tiny family pipeline and the checks every family's must pass (issue 36
stage 4a): step 0 (the first fifth of 3 steps) and the first sparse layer dense, density < 1 on the
other sparse layers' later steps, the text rows and columns of every selection dense, the layers
the family never makes sparse dense with the reason.

Backend "sdpa": full precision restricted to each call's tile mask (`sparse.sdpa_mask`), the same
selection and records as the quantized backends at a fraction of the reference's CPU time."""

from __future__ import annotations

import math

import sagevideo
import sagevideo.pipelines.sparse as sparse_module
from sagevideo.jobs.specs import JobSpec
from sagevideo.pipelines import runner
from sagevideo.pipelines.sparse import NOT_SPARSE_LAYER, first_sparse_layers, job_plan

STEPS = 3  # ceil(3 / 5) = 1 dense step


def sparse_run(pipe, monkeypatch, *, size: int, text_tokens: int = 32, sparse: str = "static:0.3", frames: int = 9):
    """(the `record_backends` summary, [(layer-independent selection keywords, TileMask)]) of one job
    of `pipe` at size x size px under `job_plan`'s plan for `sparse`."""
    selections = []
    real = sparse_module.select_tiles

    def spy(q, k, **options):
        mask = real(q, k, **options)
        selections.append((options, mask))
        return mask

    monkeypatch.setattr(sparse_module, "select_tiles", spy)
    job = JobSpec(prompt="a cat", frames=frames, height=size, width=size, steps=STEPS, guidance=2.0)
    plan = job_plan(pipe, "fp16", sparse, STEPS)
    with sagevideo.install(pipe, plan, backend="sdpa"), sagevideo.record_backends() as log:
        runner.run_job(pipe, job, text_tokens=text_tokens, decode=False)
    return log.summary()["sparse"], selections


def layer_densities(summary) -> dict[str, float]:
    """Layer -> the density its calls reached, from a `record_backends` summary of a sparse plan."""
    return {name: layer["density"] for name, layer in summary["sparse"]["layers"].items()}


def check_sparse_run(pipe, summary, selections, *, text_first: int, text_last: int, never: set[str] = frozenset()):
    """The checks of the module docstring; `never`: layers the family never makes sparse."""
    first = first_sparse_layers(pipe)
    assert first and all(summary["layers"][name]["density"] == 1.0 for name in first)
    assert summary["steps"]["0"] == 1.0 and all(summary["steps"][str(s)] < 1.0 for s in range(1, STEPS))
    sparse_layers = set(summary["layers"]) - set(first) - never
    assert sparse_layers and all(summary["layers"][name]["min"] < 1.0 for name in sparse_layers)
    for name in never:
        entry = summary["layers"][name]
        assert (entry["density"], entry["min"], entry["sparse_density"]) == (1.0, 1.0, 1.0)
        assert entry["dense"] == {NOT_SPARSE_LAYER: entry["sparse_calls"]} and entry["sparse_calls"] < entry["calls"]
    assert set(summary["dense"]) == ({NOT_SPARSE_LAYER} if never else set())  # planned sparse, run dense
    assert selections
    for options, mask in selections:
        assert (options["text_first"], options["text_last"]) == (text_first, text_last)
        keep = mask.keep
        rows, cols = math.ceil(text_first / mask.block_m), math.ceil(text_first / mask.block_n)
        assert keep[..., :rows, :].all() and keep[..., :, :cols].all()
        if text_last:
            row, col = (mask.n_q - text_last) // mask.block_m, (mask.n_k - text_last) // mask.block_n
            assert keep[..., row:, :].all() and keep[..., :, col:].all()
        assert not keep.all()  # the shape was chosen so that some tile is skipped
