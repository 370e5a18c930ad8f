"""HunyuanVideo under Ulysses sequence parallelism: the tiny transformer over 2 CPU processes
(gloo) equals one process, with the text mask padding most of the text; the degree rule.

Tolerance (as tests/parallel/test_ulysses.py): the sharded forward differs from one process only
by fp32 summation order in the linear layers (Ulysses moves data exactly, and each head's
attention sees [all video; text] in the one-process order with the full mask): max |diff| < 1e-5,
with SDPA and with the quantized reference inside.
"""

import os

import pytest
import torch

BACKENDS = ("sdpa", "reference")
# Block-sparse plans over the ranks (backend sdpa: full precision on the mask's tiles) at 3 x 12 x 12
# video tokens and the text last: static windows skip tiles on any weights; dynamic selection keeps
# every tile of random weights, so it shows only that each rank selects and runs.
SPARSE = ("static:0.3", "dynamic:0.3")
SPARSE_SIZE = 24


def _model():
    from diffusers import HunyuanVideoTransformer3DModel

    from sagevideo.pipelines.hunyuanvideo.tiny import TRANSFORMER_CONFIG

    torch.manual_seed(0)
    return HunyuanVideoTransformer3DModel(**TRANSFORMER_CONFIG).eval()


def _inputs(valid_text: int = 11, size: int = 8):
    """Latents of 3 x size x size (8: 48 video tokens) and 32 text tokens of which `valid_text` are real."""
    gen = torch.Generator().manual_seed(1)
    mask = torch.zeros(1, 32)
    mask[:, :valid_text] = 1
    return dict(
        hidden_states=torch.randn(1, 4, 3, size, size, generator=gen),
        timestep=torch.tensor([500.0]),
        encoder_hidden_states=torch.randn(1, 32, 32, generator=gen),
        encoder_attention_mask=mask,
        pooled_projections=torch.randn(1, 32, generator=gen),
        guidance=torch.tensor([6000.0]),
        return_dict=False,
    )


def _worker(rank, world, port, out_dir):
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    from sagevideo.attention.records import record_backends
    from sagevideo.parallel.launch import init_from_env
    from sagevideo.pipelines.hunyuanvideo.sequence_parallel import shard_hunyuanvideo

    init_from_env("gloo")
    model = _model()
    for backend in BACKENDS:
        with torch.no_grad(), shard_hunyuanvideo(model, backend=backend), record_backends() as log:
            out = model(**_inputs())[0]
            again = model(**_inputs(valid_text=32))[0]  # a new mask: not the cached one of the last forward
        torch.save((out, again, log.counts, log.fallback_reasons), os.path.join(out_dir, f"{backend}-rank{rank}.pt"))
    sparse = _sparse_runs(model, lambda plan: shard_hunyuanvideo(model, plan=plan, backend="sdpa"))
    torch.save(sparse, os.path.join(out_dir, f"sparse-rank{rank}.pt"))
    torch.distributed.destroy_process_group()


def _sparse_runs(model, install):
    """{setting: (output, per-layer densities)} of each SPARSE plan under `install(plan)`."""
    from sagevideo.attention.records import record_backends
    from sagevideo.pipelines.sparse import job_plan
    from tests.helpers.sparse import layer_densities

    runs = {}
    for setting in SPARSE:
        with torch.no_grad(), install(job_plan(model, "fp16", setting, steps=5)), record_backends() as log:
            out = model(**_inputs(size=SPARSE_SIZE))[0]
        runs[setting] = out, layer_densities(log.summary())
    return runs


@pytest.mark.slow  # two processes (gloo)
def test_two_ranks_equal_one_process(tmp_path, two_ranks):
    import sagevideo

    two_ranks(_worker, str(tmp_path))
    model = _model()
    for backend in BACKENDS:
        with torch.no_grad(), sagevideo.install(model, backend=backend), sagevideo.record_backends() as log:
            single = model(**_inputs())[0]
            single_again = model(**_inputs(valid_text=32))[0]
        for rank in range(2):
            out, again, counts, fallbacks = torch.load(tmp_path / f"{backend}-rank{rank}.pt")
            assert out.shape == single.shape == (1, 4, 3, 8, 8)
            assert (out - single).abs().max() < 1e-5, (backend, rank)
            assert (again - single_again).abs().max() < 1e-5, (backend, rank)
            # every rank makes the same calls as one process: 4 blocks in-kernel, the 2 refiner layers on SDPA
            assert counts == log.counts and fallbacks == log.fallback_reasons, (backend, rank)
    assert log.counts == {"reference/fp16": 8, "sdpa": 4}
    (reason,) = log.fallback_reasons
    assert "(1, 2, 32, 32) is not a key-padding mask" in reason
    # each rank selects tiles over its own heads of the whole sequence ([all video; text]), as one process does
    for setting, (single, densities) in _sparse_runs(model, lambda plan: sagevideo.install(model, plan,
                                                                                          backend="sdpa")).items():
        if setting.startswith("static"):
            assert min(densities.values()) < 1.0  # tiles were skipped
        for rank in range(2):
            sharded, rank_densities = torch.load(tmp_path / f"sparse-rank{rank}.pt")[setting]
            assert (sharded - single).abs().max() < 1e-5, (setting, rank)
            assert rank_densities == pytest.approx(densities), (setting, rank)


@pytest.mark.parametrize("name", ["framepack", "hunyuanvideo15", "i2v"])
def test_other_hunyuan_transformers_are_refused_before_any_rank_communicates(name):
    """Framepack and HunyuanVideo 1.5 (other classes, HunyuanVideo's blocks or not) and the image-to-video
    HunyuanVideoTransformer3DModel (token_replace: first-frame tokens the hooks do not split): refused
    in one process without a group, nothing installed."""
    from diffusers import HunyuanVideoTransformer3DModel

    from sagevideo.pipelines.hunyuanvideo.sequence_parallel import shard_hunyuanvideo
    from sagevideo.pipelines.hunyuanvideo.tiny import TRANSFORMER_CONFIG
    from tests.helpers.video_models import MODELS, tiny_model

    if name == "i2v":
        model = HunyuanVideoTransformer3DModel(**dict(TRANSFORMER_CONFIG, image_condition_type="token_replace"))
        match = r"the transformer has image_condition_type 'token_replace' \(image to video\)"
    else:
        model = tiny_model(name)
        match = rf"the transformer is a {MODELS[name][0]} .*splits HunyuanVideoTransformer3DModel only"
    with pytest.raises(TypeError, match=rf"shard_hunyuanvideo: {match}.*sagevideo\.install"):
        shard_hunyuanvideo(model)
    assert not hasattr(model, "_sagevideo_attention") and not model._forward_pre_hooks
