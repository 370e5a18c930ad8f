"""The scheduler's typed edges (`scheduling/spec.py`): a spec from the plan, where the batch ran."""

from __future__ import annotations

from sagevideo.generation.generate import plan_batch
from sagevideo.scheduling.spec import PoolSummary


def test_a_plans_spec_carries_what_the_scheduler_needs(tmp_path):
    plan = plan_batch(["a"], out=tmp_path, max_attempts=2, job_timeout=60)
    spec = plan.scheduling()
    assert spec.context == plan.context() and (spec.device, spec.out) == ("cpu", plan.out)
    assert (spec.ranks, spec.max_attempts, spec.job_timeout, spec.address) == (1, 2, 60.0, None)


def test_where_a_batch_ran_in_words():
    assert PoolSummary(2, 1, 1, "a local Ray instance").describe() == (
        "2 Ray worker(s) on 1 node(s) of a local Ray instance")
    assert PoolSummary(1, 1, 2, "the Ray cluster at h:1").describe() == (
        "1 Ray group(s) of 2 ranks on 1 node(s) of the Ray cluster at h:1")
