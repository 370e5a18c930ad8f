"""Sequence-parallel groups in the job queue (`scheduling/group.py`): stand-in rank actors, then
real groups.

As in test_queue.py, `ray.wait/get/kill` run over fake refs that resolve in the order they were
made, except refs of a rank that hangs (never ready): a rank stuck in a collective. Then real
groups (2 gloo ranks on a local Ray; slow).
"""

from __future__ import annotations

import itertools
import json
import os

import pytest

ray = pytest.importorskip("ray")

from ray.exceptions import ActorDiedError  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

import sagevideo  # noqa: E402
from sagevideo.cli.app import app  # noqa: E402
from sagevideo.generation.generate import plan_batch  # noqa: E402
from sagevideo.generation.run import outcome_record  # noqa: E402
from sagevideo.host import failpoints  # noqa: E402
from sagevideo.host.pipeline_host import ModelLoadError  # noqa: E402
from sagevideo.host.result import RankResult  # noqa: E402
from sagevideo.outputs.manifest import Handoff, ManifestRecord  # noqa: E402
from sagevideo.scheduling import feed  # noqa: E402
from sagevideo.scheduling import pool as pools  # noqa: E402
from sagevideo.scheduling.group import torchrun_env  # noqa: E402
from tests.helpers.sp_tolerance import JOBS, assert_same_videos  # noqa: E402

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
            if actor.rank == 0:  # rank 0's result carries the job's record
                return RankResult.of_record(fake_record(pj, attempt, worker, what))
            if what == "device":  # the others only say how their share went, as ShardedHost's do
                return RankResult(actor.rank, "failed", "OutOfMemoryError: CUDA out of memory", device_error=True)
            if what == "fail":
                return RankResult(actor.rank, "failed", "NonFiniteError: NaN")
            return RankResult(actor.rank, "done")

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
    workers_pool = pools.Pool(launcher, groups, max_attempts)
    lines = []
    todo = list(enumerate(plan.jobs))
    outcomes = list(feed.drive(plan.scheduling(), todo, workers_pool, lambda s: None, lines.append))
    records = {plan.jobs[i].job.prompt: outcome_record(plan.context(), plan.jobs[i], o) for i, o in outcomes}
    return workers_pool, records, [i for i, _ in outcomes], lines


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
    monkeypatch.setattr(pools, "STUCK_S", -1.0)  # no real waiting in the test
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


# ------------------------------------------------------------------------------------------------
# `--gpus-per-job 2 --device cpu` on a local Ray instance (2 CPUs): one group of 2 gloo ranks.
#
# Tolerance against one process with the same seed (`tests/helpers/sp_tolerance.py`): with
# attention "full" the video is byte-identical; with sagevideo's quantized attention the decoded
# frames agree to a mean of 1.5 levels of 255 (see there why not bit for bit).
# One batch covers both the comparison and a rank killed mid-job, so that the test starts only two
# groups (each rank imports torch and diffusers: ~8 s on two cores).


def manifest(out):
    return [json.loads(line) for line in (out / "manifest.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_two_ranks_match_one_process_and_a_killed_rank_restarts_the_group(tmp_path, ray_local, monkeypatch):
    """Rank 1 exits in the middle of denoising the KILL job (rank 0 then waits for it in an
    all-to-all): the whole group is stopped, a new group runs the job again, and every job ends
    exactly once with the video one process makes. The batch runs a recipe (regional compile): each
    rank compiles its blocks, Ulysses' all-to-alls inside them, and rank 0 records it."""
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(JOBS)
    recipe = sagevideo.Recipe(compile="regional", compile_backend="eager")
    one = sagevideo.generate(jobs, out=tmp_path / "one", device="cpu", recipe=recipe, progress=False)

    monkeypatch.setenv(failpoints.ENV, "mid-denoise=KILL:1@1")  # rank 1, first attempt only
    out = tmp_path / "sp"
    args = ["generate", str(jobs), "--out", str(out), "--device", "cpu", "--gpus-per-job", "2", "--no-progress",
            "--compile", "regional", "--compile-backend", "eager"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "3 done, 0 skipped, 0 failed" in result.stdout and "Ray group(s) of 2 ranks" in result.stdout
    assert "1 job(s) retried after a worker died" in result.stdout
    assert "rank 0 decodes and writes" in result.stderr and "retrying job" in result.stderr

    lines = manifest(out)
    assert sorted(r["job_id"] for r in lines) == sorted(r["job_id"] for r in one)  # each job exactly once
    assert {r["status"] for r in lines} == {"done"}
    assert all(r["worker"]["ranks"] == 2 and r["worker"]["rank"] == 0 for r in lines)
    assert all(r["recipe"]["compiled_blocks"] == 2 for r in [*lines, *one])
    killed = next(r for r in lines if r["prompt"].startswith("KILL"))
    error = killed["retries"][0]["error"]
    assert killed["attempts"] == 2 and "rank 1 of group" in error and "died during the job" in error
    assert killed["worker"]["pid"] != killed["retries"][0]["worker"]["pid"]  # a new group's rank 0
    assert all(r["attempts"] == 1 for r in lines if r is not killed)
    assert sorted(os.listdir(out)) == ["full.mp4", "killed.mp4", "manifest.jsonl", "sage.mp4"]
    assert_same_videos(out, tmp_path / "one")
    # Rank 0 counts every attention call of a job (2 layers x 2 steps), as one process does; with
    # attention "full" one process installs nothing, while Ulysses runs SDPA in its own processors.
    by_id = {r["job_id"]: r for r in one}
    for r in lines:
        expected = {"sdpa": 4} if r["attention"] == "full" else by_id[r["job_id"]]["backends"]["counts"]
        assert r["backends"]["counts"] == expected, r["prompt"]
