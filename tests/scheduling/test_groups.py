"""Sequence-parallel groups in the job queue, with stand-in rank actors (no Ray processes).

As in test_queue.py, `ray.wait/get/kill` run over fake refs that resolve in the order they were
made, except refs of a rank that hangs (never ready): a rank stuck in a collective.
Real groups (2 gloo ranks on a local Ray) are in test_ray_groups.py.
"""

from __future__ import annotations

import itertools

import pytest

ray = pytest.importorskip("ray")

from ray.exceptions import ActorDiedError  # noqa: E402

from sagevideo.generation.generate import plan_batch  # noqa: E402
from sagevideo.host.pipeline_host import ModelLoadError  # noqa: E402
from sagevideo.jobs.specs import InputError  # noqa: E402
from sagevideo.outputs.manifest import Handoff, ManifestRecord  # noqa: E402
from sagevideo.scheduling import queue  # noqa: E402
from sagevideo.scheduling.cluster import Cluster, group_pool_size  # noqa: E402
from sagevideo.scheduling.group import torchrun_env  # noqa: E402

_order = itertools.count()
HANG = object()  # a rank's run() that never returns (its peer died or failed mid-collective)


class Ref:
    def __init__(self, compute, ready=True):
        self.compute, self.ready, self.order = compute, ready, next(_order)


def fake_record(pj, attempt, worker, what):
    """Rank 0's record: done (its video staged), failed, or failed on the device (as test_queue's)."""
    record = ManifestRecord(job_id=pj.job_id, prompt=pj.job.prompt, attempts=attempt, worker=worker)
    if what == "device":
        record.status, record.error = "failed", "OutOfMemoryError: CUDA out of memory"
        record.handoff = Handoff(device_error=True)
    elif what == "fail":
        record.status, record.error = "failed", "NonFiniteError: NaN"
    else:
        record.status, record.handoff = "done", Handoff(staged=f".{pj.output}.staged")
    return record


class FakeRank:
    def __init__(self, group, rank):
        self.group, self.rank, self.killed = group, rank, False


class FakeGroups:
    """Launcher of groups of `ranks` fake ranks. script(group number, rank, prompt, attempt) says
    what a rank's run does: "ok", "die", "fail" (a job error), "device" (CUDA OOM) or HANG;
    load_error(group number, rank) says why a rank cannot set up (None: it can)."""

    def __init__(self, ranks, script, load_error=lambda g, r: None):
        self.ranks, self.script, self.load_error = ranks, script, load_error
        self.groups, self.removed = [], []

    def start(self):
        number = len(self.groups) + 1
        actors = [FakeRank(number, r) for r in range(self.ranks)]
        self.groups.append(actors)
        info = lambda r: {
            "host": "fake", "pid": 100 * number + r, "node": "n", "rank": r, "error": self.load_error(number, r)
        }
        return actors, f"pg-{number}", [Ref(lambda r=r: info(r)) for r in range(self.ranks)]

    def run(self, actors, pj, attempt):
        return [self._run(actor, pj, attempt) for actor in actors]

    def _run(self, actor, pj, attempt):
        what = self.script(actor.group, actor.rank, pj.job.prompt, attempt)
        if what is HANG:
            return Ref(lambda: pytest.fail("a hanging rank was read"), ready=False)

        def compute():
            if what == "die":
                raise ActorDiedError()
            worker = {"host": "fake", "pid": 100 * actor.group + actor.rank, "node": "n", "rank": actor.rank}
            if actor.rank == 0:  # rank 0's host returns the job's record
                return fake_record(pj, attempt, worker, what)
            result = {"rank": actor.rank, "status": "done", "error": None}  # the others, as ShardedHost's do
            if what == "device":
                return {**result, "status": "failed", "error": "OutOfMemoryError: CUDA out of memory",
                        "_device_error": True}
            if what == "fail":
                return {**result, "status": "failed", "error": "NonFiniteError: NaN"}
            return result

        return Ref(compute)

    def stop(self, actors, group):
        for actor in actors:
            actor.killed = True
        self.removed.append(group)


@pytest.fixture
def fake_ray(monkeypatch):
    def wait(refs, num_returns=1, timeout=None):
        ready = [r for r in refs if r.ready]
        first = min(ready, key=lambda r: r.order) if ready else None
        return ([first] if first else []), [r for r in refs if r is not first]

    monkeypatch.setattr(ray, "wait", wait)
    monkeypatch.setattr(ray, "get", lambda ref: ref.compute())


def drive(tmp_path, prompts, launcher, *, groups=1, max_attempts=3):
    plan = plan_batch(prompts, out=tmp_path, device="cpu", gpus_per_job=2, max_attempts=max_attempts)
    pool = queue._Pool(launcher, groups, max_attempts)
    lines = []
    results = list(queue._drive(plan, list(enumerate(plan.jobs)), pool, lambda s: None, lines.append))
    return pool, {plan.jobs[i].job.prompt: r for i, r in results}, [i for i, _ in results], lines


def test_a_dead_rank_restarts_the_whole_group_and_the_job_runs_again(tmp_path, fake_ray):
    script = lambda g, r, prompt, attempt: ("die" if r == 1 else HANG) if prompt == "k" and attempt == 1 else "ok"
    groups = FakeGroups(2, script)
    pool, records, order, lines = drive(tmp_path, ["a", "k", "b"], groups)
    assert sorted(order) == [0, 1, 2]  # every job exactly once
    assert {r["status"] for r in records.values()} == {"done"}
    k = records["k"]
    assert k["attempts"] == 2 and "rank 1 of group fake:100 died during the job" in k["retries"][0]["error"]
    assert k["worker"]["pid"] == 200  # rank 0 of the second group
    first, second = groups.groups
    assert all(a.killed for a in first) and groups.removed[0] == "pg-1"  # rank 0 too, and its placement group
    assert any("retrying job" in line for line in lines)


def test_a_rank_that_fails_alone_while_its_peer_waits_is_stopped_and_retried(tmp_path, fake_ray, monkeypatch):
    monkeypatch.setattr(queue, "STUCK_S", -1.0)  # no real waiting in the test
    script = lambda g, r, prompt, attempt: ("device" if r == 1 else HANG) if g == 1 else "ok"
    pool, records, order, lines = drive(tmp_path, ["a"], FakeGroups(2, script))
    assert records["a"]["status"] == "done" and records["a"]["attempts"] == 2
    assert "rank 1 of group fake:100: OutOfMemoryError" in records["a"]["retries"][0]["error"]

    script = lambda g, r, prompt, attempt: ("fail" if r == 1 else HANG) if g == 1 else "ok"
    pool, records, order, lines = drive(tmp_path / "2", ["a"], FakeGroups(2, script))
    assert records["a"]["attempts"] == 2
    assert "rank 1 of group fake:100 failed (NonFiniteError: NaN) while ranks [0] waited for it" in (
        records["a"]["retries"][0]["error"]
    )


def test_a_job_error_on_every_rank_fails_once_and_ranks_that_disagree_retry(tmp_path, fake_ray):
    script = lambda g, r, prompt, attempt: "fail" if prompt == "nan" else "ok"
    groups = FakeGroups(2, script)
    pool, records, order, lines = drive(tmp_path, ["nan", "a"], groups)
    assert records["nan"]["status"] == "failed" and records["nan"]["attempts"] == 1 and records["nan"]["retries"] == []
    assert records["a"]["status"] == "done" and len(groups.groups) == 1  # the group went on

    script = lambda g, r, prompt, attempt: "fail" if (g, r) == (1, 1) else "ok"
    pool, records, order, lines = drive(tmp_path / "2", ["a"], FakeGroups(2, script))
    assert records["a"]["status"] == "done" and records["a"]["attempts"] == 2
    assert "where rank 0 did not" in records["a"]["retries"][0]["error"]


def test_a_rank_that_cannot_load_stops_its_group(tmp_path, fake_ray):
    ok = lambda g, r, prompt, attempt: "ok"
    groups = FakeGroups(2, ok, lambda g, r: "could not load model tiny: no memory" if r == 1 else None)
    with pytest.raises(ModelLoadError, match="could not load model tiny: no memory"):
        drive(tmp_path, ["a"], groups)
    assert all(a.killed for actors in groups.groups for a in actors)
    # Only the first group fails to load: the batch runs on the second.
    groups = FakeGroups(2, ok, lambda g, r: "no memory" if (g, r) == (1, 0) else None)
    pool, records, order, lines = drive(tmp_path / "2", ["a", "b"], groups, groups=2)
    assert {r["worker"]["pid"] for r in records.values()} == {200}
    assert any("a Ray worker could not start: no memory" in line for line in lines)


def test_several_groups_share_the_batch(tmp_path, fake_ray):
    groups = FakeGroups(2, lambda g, r, prompt, attempt: "ok")
    pool, records, order, lines = drive(tmp_path, [f"shot {i}" for i in range(4)], groups, groups=2)
    assert sorted(order) == [0, 1, 2, 3]
    assert {r["worker"]["pid"] for r in records.values()} == {100, 200}  # rank 0 of each group wrote
    assert [s["ranks"] for s in pool.seen] == [2, 2]


def test_torchrun_variables_of_a_rank():
    places = [{"rank": 0, "ip": "10.0.0.5", "gpus": ["3"], "port": 29511}, {"rank": 1, "ip": "10.0.0.5", "gpus": ["1"]}]
    env = torchrun_env(1, places)
    assert env == {
        "RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
        "MASTER_ADDR": "10.0.0.5", "MASTER_PORT": "29511",
        "CUDA_VISIBLE_DEVICES": "3,1",  # the group's GPUs in rank order: LOCAL_RANK 1 is GPU 1
    }
    cpu = [{"rank": 0, "ip": "10.0.0.5", "gpus": [], "port": 29511}, {"rank": 1, "ip": "10.0.0.5", "gpus": []}]
    assert "CUDA_VISIBLE_DEVICES" not in torchrun_env(0, cpu)


def test_groups_fit_on_one_node_each():
    two_small = Cluster("a:1", False, 2, 4.0, 2.0, ({"CPU": 2.0, "GPU": 1.0}, {"CPU": 2.0, "GPU": 1.0}))
    with pytest.raises(InputError, match=r"--gpus-per-job 2: no node .* has 2 GPUs for one group .*largest node has 1"):
        group_pool_size(None, "cuda", two_small, 2, jobs=5)
    big = Cluster("a:1", False, 2, 64.0, 12.0, ({"CPU": 32.0, "GPU": 8.0}, {"CPU": 32.0, "GPU": 4.0}))
    assert group_pool_size(None, "cuda", big, 4, jobs=10) == (3, [])  # 2 groups + 1 group
    size, notes = group_pool_size(5, "cuda", big, 4, jobs=10)
    assert size == 3 and "room for 3 group(s) of 4" in notes[0]
    assert group_pool_size(None, "cpu", big, 4, jobs=10)[0] == 2  # CPU: one group per node
