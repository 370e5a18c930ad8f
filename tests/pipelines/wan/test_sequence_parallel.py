"""Wan under Ulysses sequence parallelism (`pipelines/wan/sequence_parallel.py`): 2 CPU processes (gloo)
against one process, for the transformer of each Wan layout and for a Wan 2.2 pipeline's two
denoisers, then a batch over 2 ranks as `sagevideo generate --gpus-per-job 2 --device cpu` runs it in
each rank.

Tolerance: the all-to-all moves activations exactly and each head's attention, quantization groups
included, sees the inputs of one process (cross-attention queries are exchanged too when Q is
scaled per block). With SDPA inside, max |diff| < 1e-5 (as tests/parallel/test_ulysses.py;
measured: 0, bit-equal). With sagevideo's quantization emulation, < 1e-4: the emulation's fp32
products over the 512 text keys differ by ~1e-8 between one call of 2 heads and 2 calls of 1 head
(BLAS blocking), which can flip one INT8 rounding in the next block (measured: max 4.2e-5, in 60
of 3072 values of the text-to-video transformer; 5e-7 for the others). Videos:
`tests/helpers/sp_tolerance.py` (attention "full" byte-identical mp4s; quantized attention within
a mean of 1.5 levels of 255).
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

BACKENDS = ("sdpa", "reference")
LAYOUTS = ("t2v", "ti2v", "i2v")  # Wan 2.1 text-to-video, TI2V-5B per-token timesteps, Wan 2.1 I2V image tokens
TOLERANCE = {"sdpa": 1e-5, "reference": 1e-4}  # see the module docstring
# Block-sparse plans over the ranks: static windows skip tiles on any weights; dynamic selection keeps
# every tile of random weights (not self-similar), so it only shows that each rank selects and runs.
SPARSE = ("static:0.3", "dynamic:0.3")
SPARSE_SIZE = 24  # 3 x 12 x 12 = 432 video tokens: tiles to skip (8 x 8 latents make one tile)


def _transformer(layout: str, size: int = 8):
    """The tiny Wan transformer of `layout` (fp32, eval) and its inputs: 3 latent frames of size x size
    (8: 48 video tokens), 512 text tokens (Wan's context: the I2V processor splits image tokens off by it)."""
    from diffusers import WanTransformer3DModel

    from sagevideo.pipelines.wan.tiny import I2V_TRANSFORMER_CONFIG, TRANSFORMER_CONFIG

    config = I2V_TRANSFORMER_CONFIG if layout == "i2v" else TRANSFORMER_CONFIG
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = WanTransformer3DModel(**config).eval()
    gen = torch.Generator().manual_seed(1)
    inputs = dict(hidden_states=torch.randn(1, config["in_channels"], 3, size, size, generator=gen),
                  timestep=torch.tensor([700.0]), encoder_hidden_states=torch.randn(1, 512, 32, generator=gen),
                  return_dict=False)
    if layout == "ti2v":  # the first latent frame is the image's: timestep 0 there (WanPipeline's expand_timesteps)
        inputs["timestep"] = torch.cat([torch.zeros(16), torch.full((32,), 700.0)])[None]
    if layout == "i2v":
        inputs["encoder_hidden_states_image"] = torch.randn(1, 17, 32, generator=gen)
    return model, inputs


def _worker(rank, world, port, out_dir):
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import sagevideo
    from sagevideo.parallel.launch import init_from_env
    from sagevideo.pipelines.plans import AttentionPlan
    from sagevideo.pipelines.sparse import job_plan
    from sagevideo.pipelines.wan.sequence_parallel import shard_wan
    from tests.helpers.sparse import layer_densities
    from tests.helpers.wan import run_wan22, tiny_wan22_pipeline

    init_from_env("gloo")
    results = {}
    for layout in LAYOUTS:
        model, inputs = _transformer(layout)
        for backend in BACKENDS:
            with torch.no_grad(), shard_wan(model, backend=backend), sagevideo.record_backends() as log:
                results[layout, backend] = model(**inputs)[0], log.summary()
    pipe = tiny_wan22_pipeline(boundary_ratio=0.5)
    with shard_wan(pipe, backend="reference"), sagevideo.record_backends() as log:
        results["wan22"] = run_wan22(pipe, steps=2), log.summary()
    # all-to-alls per forward: self-attention always; cross-attention only with per-block Q scales
    exchange, calls = torch.distributed.all_to_all_single, []
    torch.distributed.all_to_all_single = lambda *a, **k: calls.append(1) or exchange(*a, **k)
    model, inputs = _transformer("t2v")
    for granularity in ("block", "token"):
        calls.clear()
        with torch.no_grad(), shard_wan(model, plan=AttentionPlan.uniform("int8-fp16", granularity),
                                        backend="reference"):
            out = model(**inputs)[0]
        results["t2v", granularity] = out, len(calls)
    torch.distributed.all_to_all_single = exchange  # this rank's process runs other tests' functions next
    model, inputs = _transformer("t2v", SPARSE_SIZE)
    for setting in SPARSE:
        with torch.no_grad(), shard_wan(model, plan=job_plan(model, "fp16", setting, steps=5), backend="sdpa"), \
                sagevideo.record_backends() as log:
            results["sparse", setting] = model(**inputs)[0], layer_densities(log.summary())
    torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    torch.distributed.destroy_process_group()


@pytest.mark.slow  # two processes (gloo)
def test_two_ranks_equal_one_process(tmp_path, two_ranks):
    import sagevideo
    from sagevideo.pipelines.plans import AttentionPlan
    from sagevideo.pipelines.sparse import job_plan
    from tests.helpers.sparse import layer_densities
    from tests.helpers.wan import run_wan22, tiny_wan22_pipeline

    two_ranks(_worker, str(tmp_path))
    ranks = [torch.load(tmp_path / f"rank{rank}.pt") for rank in range(2)]
    for layout in LAYOUTS:
        model, inputs = _transformer(layout)
        for backend in BACKENDS:
            with torch.no_grad(), sagevideo.install(model, backend=backend), sagevideo.record_backends() as log:
                single = model(**inputs)[0]
            for rank, results in enumerate(ranks):
                sharded, summary = results[layout, backend]
                assert sharded.shape == single.shape, (layout, backend, rank)
                assert (sharded - single).abs().max() < TOLERANCE[backend], (layout, backend, rank)
                # each rank routes every one of its attention calls, as one process does
                assert summary == log.summary(), (layout, backend, rank)
    model, inputs = _transformer("t2v")
    for granularity, exchanges in (("block", 2 * 2 + 2 * 2), ("token", 2 * 2)):  # 2 blocks x (in, out)
        with torch.no_grad(), sagevideo.install(model, AttentionPlan.uniform("int8-fp16", granularity),
                                                backend="reference"):
            single = model(**inputs)[0]
        for results in ranks:
            sharded, calls = results["t2v", granularity]
            assert calls == exchanges and (sharded - single).abs().max() < TOLERANCE["reference"], granularity
    pipe = tiny_wan22_pipeline(boundary_ratio=0.5)  # 2 steps: one on each denoiser
    with sagevideo.install(pipe, backend="reference"), sagevideo.record_backends() as log:
        single = run_wan22(pipe, steps=2)
    assert log.summary()["counts"] == {"reference/fp16": 2 * 2 * 4}
    for results in ranks:
        sharded, summary = results["wan22"]
        assert (sharded - single).abs().max() < TOLERANCE["reference"] and summary == log.summary()
    # a sparse plan: each rank selects tiles over its own heads of the whole sequence, as one process does
    model, inputs = _transformer("t2v", SPARSE_SIZE)
    for setting in SPARSE:
        with torch.no_grad(), sagevideo.install(model, job_plan(model, "fp16", setting, steps=5), backend="sdpa"), \
                sagevideo.record_backends() as log:
            single, densities = model(**inputs)[0], layer_densities(log.summary())
        assert densities["blocks.0.attn1"] == 1.0  # the first layer stays dense
        if setting.startswith("static"):
            assert densities["blocks.1.attn1"] < 1.0
        for rank, results in enumerate(ranks):
            sharded, rank_densities = results["sparse", setting]
            assert (sharded - single).abs().max() < TOLERANCE["sdpa"], (setting, rank)
            assert rank_densities == pytest.approx(densities), (setting, rank)


def test_only_self_attention_is_exchanged(wan_pipes):
    """attn1 (over the sharded video tokens) goes through the all-to-all; attn2 attends the
    replicated text (and image) tokens with the rank's own queries, locally."""
    from sagevideo.pipelines.wan.sequence_parallel import self_attention_layers

    assert self_attention_layers(wan_pipes["tiny-wan22"]) == {
        f"{prefix}blocks.{i}.attn1" for prefix in ("", "transformer_2.") for i in range(2)}
    assert self_attention_layers(wan_pipes["tiny-wan-i2v"].transformer) == {"blocks.0.attn1", "blocks.1.attn1"}


# Wan-derived diffusers transformers shard_wan does not split: ChronoEdit and SkyReels-V2 have their own
# attention classes (not exchanged: each rank would attend within its half of the tokens, no error),
# VACE's control blocks take inputs the hooks do not split. Refused before any collective, so one
# process without a group shows it.
DERIVED = {
    "ChronoEditTransformer3DModel": {},
    "SkyReelsV2Transformer3DModel": {},
    "WanVACETransformer3DModel": dict(vace_layers=[0], vace_in_channels=8),
}


@pytest.mark.parametrize("name", sorted(DERIVED))
def test_wan_derived_transformers_are_refused(name):
    import diffusers

    from sagevideo.pipelines.wan.sequence_parallel import shard_wan
    from sagevideo.pipelines.wan.tiny import TRANSFORMER_CONFIG

    model = getattr(diffusers, name)(**TRANSFORMER_CONFIG, **DERIVED[name]).eval()
    processors = model.attn_processors
    with pytest.raises(TypeError, match=rf"shard_wan: the transformer is a {name} .*splits WanTransformer3DModel "
                                        r"only .*not VACE, Animate, ChronoEdit or SkyReels-V2.*sagevideo\.install"):
        shard_wan(model)
    pipe = diffusers.WanPipeline(tokenizer=None, text_encoder=None, vae=None, scheduler=None,
                                 transformer=_transformer("t2v")[0], transformer_2=model, boundary_ratio=0.5)
    with pytest.raises(TypeError, match=rf"shard_wan: transformer_2 is a {name}"):
        shard_wan(pipe)
    assert model.attn_processors == processors and not hasattr(pipe.transformer, "_sagevideo_attention")


def test_a_wan_transformer_with_another_attention_processor_is_refused():
    from diffusers.models.transformers.transformer_wan import WanAttnProcessor

    from sagevideo.pipelines.wan.sequence_parallel import shard_wan

    class MyProcessor(WanAttnProcessor):  # a subclass: still not what the hooks exchange
        pass

    model = _transformer("t2v")[0]
    model.blocks[1].attn1.set_processor(MyProcessor())
    with pytest.raises(TypeError, match=r"shard_wan: blocks\.1\.attn1 runs MyProcessor .*WanAttnProcessor only"):
        shard_wan(model)


# --- a batch over 2 ranks: what `generate --gpus-per-job 2 --device cpu` runs in each rank ----------

from tests.helpers.sp_tolerance import JOBS, MEAN_LEVELS, assert_same_videos, frames  # noqa: E402
from tests.helpers.torchrun_ranks import torchrun_on_two_ranks  # noqa: E402


@pytest.mark.slow  # two gloo ranks
def test_a_batch_over_two_ranks_matches_one_process(tmp_path, two_ranks):
    """tiny-wan22 (both denoisers split) through the ranks' batch path (tests/helpers/torchrun_ranks.py);
    jobs with a sparse setting reach both ranks (each selects over its own heads, so rank 0 notes the
    one process's densities; with reuse, each rank attends on the lists its own forward kept); then the
    same command again resumes (nothing runs twice)."""
    import json

    import sagevideo

    jobs = tmp_path / "jobs.yaml"
    # 128x128: 3 x 8 x 8 latent tokens, enough tiles for static windows to skip some
    # 5 steps: the first dense, then lists selected at steps 1 and 3 and reused at steps 2 and 4
    jobs.write_text(JOBS + "  - prompt: a quiet lake\n    output: sparse\n    sparse: static:0.3\n"
                    "    height: 128\n    width: 128\n"
                    "  - prompt: a still pond\n    output: reused\n    sparse: dynamic:0.3:reuse2\n"
                    "    height: 128\n    width: 128\n    steps: 5\n")
    one = sagevideo.generate(jobs, out=tmp_path / "one", model="tiny-wan22", device="cpu", progress=False)
    args = [str(jobs), "--model", "tiny-wan22", "--out", str(tmp_path / "sp"), "--device", "cpu", "--no-progress"]
    ranks = torchrun_on_two_ranks(two_ranks, args, tmp_path / "logs")
    assert [rank["code"] for rank in ranks] == [0, 0], ranks[0]["stderr"]
    assert "5 done, 0 skipped, 0 failed" in ranks[0]["stdout"] and "2 ranks; rank 0 decodes" in ranks[0]["stderr"]
    assert_same_videos(tmp_path / "sp", tmp_path / "one")
    for name in ("sparse", "reused"):
        a, b = frames(tmp_path / "sp" / f"{name}.mp4"), frames(tmp_path / "one" / f"{name}.mp4")
        assert a.shape == b.shape and np.abs(a - b).mean() <= MEAN_LEVELS, name
    records = [json.loads(line) for line in (tmp_path / "sp" / "manifest.jsonl").read_text().splitlines()]
    by_id = {r.job_id: r for r in one}
    for r in records:
        assert r["family"] == "wan" and r["worker"]["ranks"] == 2 and r["status"] == "done"
        # rank 0 counts every call (2 steps x 2 forwards x 4 layers); "full" runs SDPA inside Ulysses
        expected = {"sdpa": 16} if r["attention"] == "full" else by_id[r["job_id"]].backends["counts"]
        assert r["backends"]["counts"] == expected, r["prompt"]
    # the ranks' records say how evenly their heads were loaded (every head keeps the same tiles here)
    sparse = next(r for r in records if r["sparse"] == "static:0.3")
    layers = sparse["backends"]["sparse"]["layers"]
    spreads = [layer.pop("rank_spread") for layer in layers.values() if "rank_spread" in layer]
    assert spreads and set(spreads) == {1.0}
    assert layers == by_id[sparse["job_id"]].backends["sparse"]["layers"]
    assert min(layer.get("sparse_density", 1.0) for layer in layers.values()) < 1.0
    reused = next(r for r in records if r["sparse"] == "dynamic:0.3:reuse2")
    layers = reused["backends"]["sparse"]["layers"]
    spreads = [layer.pop("rank_spread") for layer in layers.values() if "rank_spread" in layer]
    assert spreads and set(spreads) == {1.0}
    assert layers == by_id[reused["job_id"]].backends["sparse"]["layers"]
    assert sum(layer.get("reused", 0) for layer in layers.values()) > 0
    again = torchrun_on_two_ranks(two_ranks, args, tmp_path / "logs-again")
    assert again[0]["code"] == 0 and "0 done, 5 skipped, 0 failed" in again[0]["stdout"], again[0]["stderr"]
