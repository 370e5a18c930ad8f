"""`AttentionRouter`: a model's own mask that the kernels cannot take runs SDPA, recorded with its reason."""

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
