"""`experiments/bench/attention.py` on the CPU: real small runs (SDPA's math backend and sageattn's
reference backend), the JSON they write, and the checks made before any tensor."""

import json

import pytest
import torch

from sagevideo.errors import InputError
from sagevideo.experiments.bench.attention import (
    AttentionBenchPlan,
    AttentionShape,
    BenchAttentionConfig,
    bench_shape,
    flashinfer_block_sparse,
    parse_shape,
    random_tile_mask,
    resolve,
    run_bench_attention,
)


def test_shapes_parse_from_text():
    assert parse_shape("2x48x17776x64") == AttentionShape(2, 48, 17776, 17776, 64)
    cross = parse_shape("1X40x75600x512x128")
    assert cross == AttentionShape(1, 40, 75600, 512, 128) and cross.label == "1x40x75600x512x128"
    assert cross.flops == 4 * 40 * 75600 * 512 * 128
    for bad in ("2x48x64", "2x48x0x64", "2x48xNx64", ""):
        with pytest.raises(ValueError, match="not BxHxNxD"):
            parse_shape(bad)


def test_a_small_run_times_every_arm_and_writes_the_report(tmp_path):
    path = tmp_path / "bench.json"
    config = BenchAttentionConfig(shapes=["1x2x64x32", "1x2x64x16x32"], budget_ms=2, json_out=path)
    lines = []
    report = run_bench_attention(config, progress=lines.append)
    assert len(lines) == 2 and lines[0].startswith("[1/2] 1x2x64x32")
    data = json.loads(path.read_text())
    assert data["schema"] == "sagevideo.bench.attention" and data["version"] == 1
    assert (data["device"], data["dtype"], data["backend"]) == ("cpu", "float32", "reference")
    assert [s["label"] for s in data["shapes"]] == ["1x2x64x32", "1x2x64x16x32"]
    for shape in report.shapes:
        sdpa, sage = shape.arm("sdpa-math"), shape.arm("sagevideo-fp16")
        assert shape.best_sdpa == "sdpa-math" and sdpa.ran == "math"
        assert sage.ran == "reference/fp16" and sage.note == ""  # what sageattn says it ran
        for arm in (sdpa, sage):
            assert len(arm.reps_ms) == 3 and arm.ms == sorted(arm.reps_ms)[1]
            assert arm.tops == pytest.approx(4 * 2 * 64 * shape.n_k * 32 / (arm.ms * 1e-3) / 1e12)
            assert arm.x_best_sdpa == pytest.approx(sdpa.ms / arm.ms) and arm.x_cudnn is None  # no cuDNN on a CPU
        assert sdpa.cos_worst == pytest.approx(1.0, abs=1e-6)  # exact arm
        assert 0.999 < sage.cos_worst < 1.0  # INT8 Q/K: close, not exact
    assert "sagevideo-fp16 (reference/fp16)" in report.summary()
    assert "sdpa-math" in report.table()


def test_an_arm_that_cannot_run_says_why_and_takes_no_ratio():
    """cuDNN on the CPU: SDPA refuses it; the arm keeps its error and the others go on."""
    plan = AttentionBenchPlan(device="cpu", dtype="float32", backend="reference", pv=["fp16"],
                              sdpa=["cudnn", "math"], shapes=[])
    row = bench_shape(AttentionShape(1, 1, 16, 16, 32), plan, reps=2, budget_ms=1,
                      measure=lambda fn: (fn(), 1.0)[1])  # a fake clock: every arm 1 ms
    cudnn = row.arm("sdpa-cudnn")
    assert cudnn.ms is None and cudnn.x_best_sdpa is None and cudnn.note
    assert row.best_sdpa == "sdpa-math" and row.arm("sagevideo-fp16").x_best_sdpa == 1.0


def test_a_models_attention_calls_are_its_shapes():
    plan = resolve(BenchAttentionConfig(model="tiny-wan"))
    assert [(s.label, calls) for s, calls, _ in plan.shapes] == [("1x2x48x64", 4), ("1x2x48x8x64", 4)]


@pytest.mark.parametrize(("options", "message"), [
    ({}, "nothing to time"),
    ({"shapes": ["2x48x64"]}, "--shape '2x48x64': not BxHxNxD"),
    ({"shapes": ["1x2x8x32"], "backend": "triton"}, "--backend triton --pv fp16 at 1x2x8x32 (float32)"),
    ({"shapes": ["1x2x8x32"], "sdpa": ["flash"]}, "--sdpa flash: on the CPU only SDPA's math backend"),
])
def test_bad_input_is_refused_before_any_tensor(options, message):
    with pytest.raises(InputError, match=message.replace("(", r"\(").replace(")", r"\)")):
        resolve(BenchAttentionConfig(**options))


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_cuda_without_a_gpu_is_refused():
    with pytest.raises(InputError, match="--device cuda: torch sees no CUDA GPU"):
        resolve(BenchAttentionConfig(shapes=["1x2x8x32"], device="cuda"))


def test_unknown_model_names_the_option():
    with pytest.raises(InputError, match="--model cogvideox: unknown model config 'cogvideox'"):
        BenchAttentionConfig.build(model="cogvideox")


def test_random_tile_masks_keep_the_diagonal_and_the_same_count_per_row():
    mask = random_tile_mask(AttentionShape(1, 4, 1000, 1000, 64), 0.25, "cpu")
    keep = mask.keep[0, 0]
    assert mask.keep.shape == (1, 1, 8, 8) and (mask.block_m, mask.block_n) == (128, 128)  # one mask, all heads
    assert keep.sum(dim=1).tolist() == [2] * 8 and keep.diagonal().all()
    assert torch.equal(random_tile_mask(AttentionShape(1, 4, 1000, 1000, 64), 0.25, "cpu").keep, mask.keep)
    cross = random_tile_mask(AttentionShape(1, 1, 1000, 300, 64), 0.5, "cpu").keep[0, 0]  # 8 query, 3 key tiles
    assert cross.sum(dim=1).tolist() == [2] * 8  # round(0.5 x 3)
    assert all(cross[i, min(i, 2)] for i in range(8))  # past the last key tile, the last is the "diagonal"


def test_density_arms_time_sageattn_on_the_mask_and_say_why_flashinfer_did_not_run(tmp_path):
    config = BenchAttentionConfig(shapes=["1x2x512x32"], density=[0.5, 0.25], budget_ms=2, json_out=tmp_path / "b.json")
    (shape,) = run_bench_attention(config).shapes
    dense = shape.arm("sagevideo-fp16")
    for density in (0.25, 0.5):
        sparse = shape.arm(f"sagevideo-fp16-d{density:g}")
        assert sparse.density == density and sparse.ran == "reference/fp16"
        assert sparse.x_dense == pytest.approx(dense.ms / sparse.ms)
        assert sparse.tops == pytest.approx(4 * 2 * 512 * 512 * 32 * density / (sparse.ms * 1e-3) / 1e12)
        assert 0.999 < sparse.cos_worst < 1.0  # against exact attention over the same tiles
        flashinfer = shape.arm(f"flashinfer-d{density:g}")
        assert flashinfer.ms is None and flashinfer.note.startswith("not run: ")
    assert dense.density is None and dense.x_dense is None


class _FakeBlockSparseWrapper:
    """flashinfer 0.7's BlockSparseAttentionWrapper as the arm calls it: plan() records its arguments."""

    planned: dict = {}

    def __init__(self, workspace):
        pass

    def plan(self, indptr, indices, M, N, R, C, num_qo_heads, num_kv_heads, head_dim, *, q_data_type="float16",
             kv_data_type=None, o_data_type="float16"):
        type(self).planned = dict(indptr=indptr, indices=indices, blocks=(M, N, R, C), o_data_type=o_data_type)


def test_the_flashinfer_arm_plans_the_mask_in_whole_blocks_with_the_inputs_dtype(monkeypatch):
    """The arm refuses, by name, a sequence that is not whole blocks (flashinfer's BSR reshape failed on
    Wan's 75,600 tokens with an unreadable error) and names the output dtype (flashinfer's default: fp16)."""
    import sys
    import types

    fake = types.SimpleNamespace(BlockSparseAttentionWrapper=_FakeBlockSparseWrapper)
    monkeypatch.setitem(sys.modules, "flashinfer", fake)
    q = torch.zeros(1, 2, 256, 32, dtype=torch.bfloat16)
    mask = random_tile_mask(AttentionShape(1, 2, 256, 256, 32), 0.5, "cpu")
    flashinfer_block_sparse(q, q, q, mask)
    planned = _FakeBlockSparseWrapper.planned
    assert planned["blocks"] == (256, 256, 128, 128) and planned["o_data_type"] == torch.bfloat16
    keep = mask.keep[0, 0]
    assert planned["indptr"].tolist() == [0, *keep.sum(dim=1).cumsum(0).tolist()]
    assert planned["indices"].tolist() == keep.nonzero()[:, 1].tolist()
    partial = torch.zeros(1, 2, 300, 32, dtype=torch.bfloat16)
    partial_mask = random_tile_mask(AttentionShape(1, 2, 300, 300, 32), 0.5, "cpu")
    with pytest.raises(ValueError, match=r"Nq a multiple of its 128-token blocks \(300 is not; e.g. 384\)"):
        flashinfer_block_sparse(partial, partial, partial, partial_mask)


def test_static_grid_arms_time_the_static_window_closest_to_each_density(tmp_path):
    """The masks installed static plans select (3-D windows on the latent grid), named apart from the
    random-tile arms; the density reported is the mask's own, exact attention over it the reference."""
    from sagevideo.attention.sparse import static_mask

    config = BenchAttentionConfig(shapes=["1x1x1024x32"], density=[0.3], static_grid="4x16x16", budget_ms=2)
    (shape,) = run_bench_attention(config).shapes
    mask = static_mask((4, 16, 16), 0.3, block_m=128, block_n=128)
    sparse = shape.arm("sagevideo-fp16-d0.3-static")
    assert sparse.density == pytest.approx(mask.density) and 0.2 < sparse.density < 0.4
    assert sparse.ran == "reference/fp16" and 0.999 < sparse.cos_worst < 1.0
    assert shape.arm("flashinfer-d0.3-static").note.startswith("not run: ")
    keep = mask.keep[0, 0]
    assert keep.shape == (8, 8) and keep.diagonal().all() and keep[:, 0].all()  # diagonal, sink column
    assert keep[0, -1].item() is False and keep[-1, 0].item() is True  # far tiles dropped, the sink kept


@pytest.mark.parametrize(("options", "message"), [
    ({"shapes": ["1x2x2048x32"], "static_grid": "4x16x32"}, "--static-grid: shapes the --density arms' masks"),
    ({"shapes": ["1x2x2000x32"], "density": [0.3], "static_grid": "4x16x32"},
     "--static-grid 4x16x32 \\(2048 tokens\\) does not match --shape 1x2x2000x32"),
    ({"shapes": ["1x2x2048x32"], "density": [0.3], "static_grid": "4x16"}, "is not a latent grid FxHxW"),
])
def test_a_static_grid_that_cannot_shape_the_masks_is_refused_before_any_tensor(options, message):
    with pytest.raises(InputError, match=message):
        resolve(BenchAttentionConfig.build(**options))


@pytest.mark.parametrize("density", [0.0, 1.0, 1.5, -0.1])
def test_a_density_outside_0_1_is_refused(density):
    with pytest.raises(InputError, match=rf"--density.*{density:g} is not a fraction of the key tiles between 0 and 1"):
        BenchAttentionConfig.build(shapes=["1x2x8x32"], density=[density])
