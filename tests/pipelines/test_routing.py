"""`AttentionRouter`: a model's own mask that the kernels cannot take runs SDPA, recorded with its reason;
the head order sequence-parallel ranks take from a plan's per-head densities."""

import pytest
import torch
import torch.nn.functional as F

from sagevideo.attention.records import record_backends
from sagevideo.pipelines.plans import AttentionPlan
from sagevideo.pipelines.routing import AttentionRouter


def _refiner_mask(valid: torch.Tensor) -> torch.Tensor:
    """HunyuanVideo's token-refiner mask (diffusers' HunyuanVideoIndividualTokenRefiner): a valid
    query attends the valid keys, a padded query key 0 only, (B, 1, N, N) bool."""
    n = valid.shape[1]
    keys = valid.view(-1, 1, 1, n).repeat(1, 1, n, 1)
    mask = keys & keys.transpose(2, 3)
    mask[:, :, :, 0] = True
    return mask


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_a_query_masking_mask_runs_sdpa_recorded_as_a_fallback_under_an_explicit_backend(backend):
    """The mask masks queries as well as keys: not a key-padding mask. The router computes it with
    SDPA (equal to SDPA with that mask) and records it as a fallback with the reason, instead of
    failing the model under the backend the run names for its other calls."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, 32, 64, generator=gen) for _ in range(3))
    valid = torch.arange(32)[None] < torch.tensor([[20], [32]])
    mask = _refiner_mask(valid)
    router = AttentionRouter(AttentionPlan.uniform("int8-fp16"), backend)
    with record_backends() as log:
        out = router("context_embedder.token_refiner.refiner_blocks.0.attn", q, k, v, attn_mask=mask)
    assert torch.equal(out, F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
    assert log.counts == {"sdpa": 1}
    (reason,) = log.fallback_reasons
    assert reason.startswith("attn_mask of shape (2, 1, 32, 32) is not a key-padding mask")


def test_a_key_padding_mask_still_runs_in_the_kernels():
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 32, 64, generator=gen) for _ in range(3))
    keep = torch.arange(32)[None, None, None] < 24
    with record_backends() as log:
        AttentionRouter(AttentionPlan.uniform("int8-fp16"), "reference")("layer", q, k, v, attn_mask=keep)
    assert log.counts == {"reference/fp16": 1} and log.fallback_reasons == {}


class _Scheduler:
    """A scheduler without `step_index` (as DDIM's): set_timesteps, then one step() per step."""

    def set_timesteps(self, steps):
        self.timesteps = list(range(steps))

    def step(self, *args):
        return args


class _Pipe:
    def __init__(self):
        self.scheduler = _Scheduler()


def test_the_step_clock_follows_a_scheduler_swapped_into_the_pipeline():
    from sagevideo.pipelines.routing import StepClock

    pipe, clock = _Pipe(), StepClock()
    clock.follow(pipe)
    pipe.scheduler.set_timesteps(4)
    for _ in range(3):
        pipe.scheduler.step()
    assert clock.step == 3
    old, pipe.scheduler = pipe.scheduler, _Scheduler()
    pipe.scheduler.set_timesteps(4)  # the next run: the new scheduler is not wrapped yet
    clock.sync()  # before the first forward
    assert clock.step == 0 and "step" not in vars(old)
    pipe.scheduler.step()
    assert clock.step == 1
    clock.sync()  # same scheduler: nothing moves
    assert clock.step == 1
    clock.detach()
    assert clock.step is None and "step" not in vars(pipe.scheduler)


@pytest.mark.parametrize("plan", ["full", "int8-fp16"])
def test_every_plan_entry_computes_what_sdpa_broadcasts(plan):
    """An intercepted call with one K/V head (no enable_gqa), a broadcast batch, a key mask and a
    negative scale, as a model may make it: SDPA's attention under "full" (torch's own, on the
    call as made) and under a quantized entry; "full" used to refuse it (sageattn's checks)."""
    from sagevideo.attention.functional import TORCH_SDPA

    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, 4, 64, 64, generator=gen).half()
    k, v = (torch.randn(2, 1, 64, 64, generator=gen).half() for _ in range(2))
    keep = torch.ones(2, 1, 1, 64, dtype=torch.bool)
    keep[1, ..., 40:] = False
    router = AttentionRouter(AttentionPlan.uniform(plan), "reference")
    with record_backends() as log:
        out = router("blocks.0.attn", q, k, v, attn_mask=keep, sm_scale=-0.125)
    if plan == "full":
        assert log.counts == {"sdpa": 1} and torch.equal(out, TORCH_SDPA(-q, k, v, attn_mask=keep, scale=0.125))
    else:
        assert log.counts == {"reference/fp16": 1}
    want = TORCH_SDPA(q.double(), k.double(), v.double(), attn_mask=keep, scale=-0.125)
    assert F.cosine_similarity(out.double().flatten(), want.flatten(), dim=0) > 0.999


def _balanced_plan(densities):
    """Dense at step 0, then a calibrated top_p with per-head densities (`Sparse.head_density`)."""
    from sagevideo.pipelines.plans import Choice, Mode, Override, Sparse

    sparse = Sparse(method="dynamic", density=0.3, top_p=0.9, head_density=densities)
    return AttentionPlan(default=Choice(mode=Mode.int8_fp16, sparse=sparse),
                         overrides=(Override(steps=(0, 1), mode=Mode.int8_fp16),))


def test_the_head_order_balances_ranks_only_where_a_sparse_step_measured_its_heads():
    router = AttentionRouter(_balanced_plan((0.9, 0.8, 0.1, 0.1)), "sdpa")
    layer = "transformer_blocks.0.attn1"
    router.clock.step = 0
    assert router.head_order(layer, 4, 2, torch.device("cpu")) is None  # a dense step: the heads' own order
    router.clock.step = 1
    order = router.head_order(layer, 4, 2, torch.device("cpu"))
    assert order.dtype == torch.int64 and order.tolist() == [0, 3, 1, 2]
    assert router.head_order(layer, 4, 2, torch.device("cpu")) is order  # made once per setting
    assert router.head_order(layer, 4, 1, torch.device("cpu")) is None  # one rank
    with pytest.raises(ValueError, match="lists 4 head densities for its 8 heads.*re-run `sagevideo calibrate`"):
        router.head_order(layer, 8, 2, torch.device("cpu"))
    # densities as balanced as the identity order: no order, so no gather
    assert AttentionRouter(_balanced_plan((0.9, 0.1, 0.8, 0.2)), "sdpa").head_order(layer, 4, 2, "cpu") is None


def test_install_refuses_per_head_densities_for_another_head_count_before_changing_anything(tiny_pipe):
    """The tiny CogVideoX has 2 heads a layer: a plan measured on 4 is another model's."""
    import sagevideo
    from sagevideo.pipelines.plans import PlanError

    transformer = tiny_pipe.transformer
    before = dict(transformer.attn_processors)
    with pytest.raises(PlanError, match=r"4 head densities for layer\(s\) with another head count, e\.g\. "
                                        r"transformer_blocks\.0\.attn1 \(2 heads\)"):
        sagevideo.install(transformer, _balanced_plan((0.9, 0.8, 0.1, 0.1)), backend="sdpa")
    assert dict(transformer.attn_processors) == before
    with sagevideo.install(transformer, _balanced_plan((0.4, 0.2)), backend="sdpa"):
        pass
