"""The job queue (`scheduling/queue.py`, with its `pool`, `feed` and `progress`): its rules with
stand-in actors, then real workers.

Stand-ins (no Ray processes): `ray.wait/get/kill` are replaced by functions over fake object refs
that resolve in the order they were made, and the queue's clock is a fake one that ray.wait moves
on, so each scenario (retries, limits, load failures, timeouts) is deterministic and takes
milliseconds. Then batches on a local Ray instance (2 CPUs, tiny model; slow): workers, killed
workers, Ctrl-C and resume, step reports crossing to the driver.
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
from sagevideo.generation.generate import BatchInterrupted, plan_batch  # noqa: E402
from sagevideo.generation.run import outcome_record  # noqa: E402
from sagevideo.host import failpoints  # noqa: E402
from sagevideo.host.pipeline_host import ModelLoadError  # noqa: E402
from sagevideo.host.result import RankResult  # noqa: E402
from sagevideo.outputs.manifest import Handoff, ManifestRecord  # noqa: E402
from sagevideo.scheduling import feed  # noqa: E402
from sagevideo.scheduling import pool as pools  # noqa: E402

_order = itertools.count()


class Ref:
    def __init__(self, compute):
        self.compute, self.order = compute, next(_order)


class Hung:
    """A call that never returns (a hung NCCL collective, a stuck GPU)."""


class Method:
    def __init__(self, fn):
        self.fn = fn

    def remote(self, *args):
        try:
            out = self.fn(*args)
        except Exception as err:  # raised by ray.get, as Ray does
            return Ref(lambda err=err: _raise(err))
        return Ref(None) if isinstance(out, Hung) else Ref(lambda: out)


def _raise(err):
    raise err


def fake_record(pj, attempt, worker, what):
    """The record a worker's host returns: done (its video staged), failed, or failed on the device."""
    record = ManifestRecord(job_id=pj.job_id, prompt=pj.job.prompt, attempts=attempt, worker=worker)
    if what == "device":
        record.status, record.error = "failed", "OutOfMemoryError: CUDA out of memory"
        record.handoff = Handoff(device_error=True)
    elif what == "fail":
        record.status, record.error = "failed", "NonFiniteError: NaN"
    else:
        record.status, record.handoff = "done", Handoff(staged=f".{pj.output}.staged")
    return record


class FakeActor:
    """Worker number n: ready() says `load_error(n)`; run() does what `script(n, prompt, attempt)` says."""

    def __init__(self, number, script, load_error):
        self.number, self.killed = number, False
        info = {"host": "fake", "pid": 1000 + number, "node": f"node-{number % 2}"}
        self.ready = Method(lambda: {**info, "error": load_error(number)})

        def run(pj, attempt):
            what = script(number, pj.job.prompt, attempt)
            if what == "hang":
                return Hung()
            if what == "die":
                raise ActorDiedError()
            return RankResult.of_record(fake_record(pj, attempt, info, what))

        self.run = Method(run)


class FakeActorClass:
    def __init__(self, script, load_error=lambda n: None):
        self.script, self.load_error, self.made = script, load_error, []

    def remote(self, *args):
        actor = FakeActor(len(self.made) + 1, self.script, self.load_error)
        self.made.append(actor)
        return actor


class FakeClock:
    """The queue's `time` in these tests: a ray.wait that times out moves it on, nothing sleeps."""

    def __init__(self):
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now


@pytest.fixture
def fake_ray(monkeypatch):
    clock = FakeClock()

    def wait(refs, num_returns=1, timeout=None):
        answered = [r for r in refs if r.compute is not None]
        if not answered:  # only hung calls: ray.wait returns empty-handed after its timeout
            clock.now += timeout or 0
            return [], list(refs)
        first = min(answered, key=lambda r: r.order)
        return [first], [r for r in refs if r is not first]

    def kill(actor, no_restart=True):
        actor.killed = True

    monkeypatch.setattr(ray, "wait", wait)
    monkeypatch.setattr(ray, "get", lambda ref: ref.compute())
    monkeypatch.setattr(ray, "kill", kill)
    monkeypatch.setattr(feed, "time", clock)  # job timeouts and STOP_WAIT_S pass on the fake clock
    monkeypatch.setattr(pools, "time", clock)


def drive(tmp_path, prompts, actor_class, *, workers=2, max_attempts=3, job_timeout=None):
    plan = plan_batch(prompts, out=tmp_path, workers=workers, max_attempts=max_attempts, job_timeout=job_timeout)
    workers_pool = pools.Pool(pools.SingleLauncher(actor_class, ()), workers, max_attempts)
    lines = []
    todo = list(enumerate(plan.jobs))
    outcomes = list(feed.drive(plan.scheduling(), todo, workers_pool, lambda s: None, lines.append))
    # The driver's records of the outcomes (`outcome_record`), as run_batch makes them.
    records = {plan.jobs[i].job.prompt: outcome_record(plan.context(), plan.jobs[i], o) for i, o in outcomes}
    return plan, workers_pool, records, [i for i, _ in outcomes], lines


def test_a_job_whose_worker_died_reruns_on_another_worker(tmp_path, fake_ray):
    script = lambda n, prompt, attempt: "die" if prompt == "k" and attempt == 1 else "ok"
    actors = FakeActorClass(script)
    plan, pool, records, order, lines = drive(tmp_path, ["a", "k", "b", "c"], actors)
    assert sorted(order) == [0, 1, 2, 3]  # every job exactly once
    assert {r["status"] for r in records.values()} == {"done"}
    k = records["k"]
    assert k["attempts"] == 2 and len(k["retries"]) == 1
    assert k["retries"][0]["worker"]["pid"] != k["worker"]["pid"]
    assert "died during the job" in k["retries"][0]["error"] and any("retrying job" in line for line in lines)
    assert actors.made[1].killed and len(actors.made) == 3  # the dead worker was replaced once


def test_a_job_that_kills_every_worker_fails_after_max_attempts_and_the_batch_goes_on(tmp_path, fake_ray):
    script = lambda n, prompt, attempt: "die" if prompt == "doomed" else "ok"
    plan, pool, records, order, lines = drive(tmp_path, ["doomed", "a", "b", "c"], FakeActorClass(script))
    assert sorted(order) == [0, 1, 2, 3]
    doomed = records.pop("doomed")
    assert doomed["status"] == "failed" and doomed["attempts"] == 3 and len(doomed["retries"]) == 3
    assert doomed["error"].endswith("gave up after 3 attempt(s)") and doomed["outputs"] == []
    assert len({r["worker"]["pid"] for r in doomed["retries"]}) == 3  # a fresh worker each time
    assert {r["status"] for r in records.values()} == {"done"}


def test_device_errors_are_retried_on_a_fresh_worker_but_a_jobs_own_failure_is_not(tmp_path, fake_ray):
    script = lambda n, prompt, attempt: {"oom": "device" if attempt == 1 else "ok", "nan": "fail"}.get(prompt, "ok")
    actors = FakeActorClass(script)
    plan, pool, records, order, lines = drive(tmp_path, ["oom", "nan", "a"], actors)
    assert records["oom"]["status"] == "done" and records["oom"]["attempts"] == 2
    assert "CUDA out of memory" in records["oom"]["retries"][0]["error"]
    assert actors.made[0].killed  # its GPU state is suspect: stopped, not reused
    assert records["nan"]["status"] == "failed" and records["nan"]["attempts"] == 1
    assert records["nan"]["retries"] == []


def test_workers_that_cannot_load(tmp_path, fake_ray):
    ok = lambda n, prompt, attempt: "ok"
    with pytest.raises(ModelLoadError, match="could not load model tiny: OSError: disk on fire"):
        drive(tmp_path, ["a", "b"], FakeActorClass(ok, lambda n: "could not load model tiny: OSError: disk on fire"))
    # One of two loads: the batch runs on the other, and the user is told.
    plan, pool, records, order, lines = drive(
        tmp_path / "2", ["a", "b", "c"], FakeActorClass(ok, lambda n: "out of memory" if n == 1 else None)
    )
    assert {r["status"] for r in records.values()} == {"done"}
    assert {r["worker"]["pid"] for r in records.values()} == {1002}
    assert any("a Ray worker could not start: out of memory" in line for line in lines)


def test_when_no_worker_is_left_the_remaining_jobs_fail_with_the_reason(tmp_path, fake_ray):
    """Workers die on every job and replacements cannot load: the batch ends, it does not hang."""
    actors = FakeActorClass(lambda n, prompt, attempt: "die", lambda n: "no GPU left" if n > 2 else None)
    plan, pool, records, order, lines = drive(tmp_path, ["a", "b", "c"], actors, max_attempts=5)
    assert sorted(order) == [0, 1, 2] and {r["status"] for r in records.values()} == {"failed"}
    assert any("no worker left to run it (no GPU left)" in r["error"] for r in records.values())


def test_a_job_past_job_timeout_has_its_worker_stopped_and_is_retried(tmp_path, fake_ray, monkeypatch):
    monkeypatch.setattr(feed, "WAIT_S", 0.05)
    script = lambda n, prompt, attempt: "hang" if prompt == "stuck" or (prompt == "once" and attempt == 1) else "ok"
    actors = FakeActorClass(script)
    plan, pool, records, order, lines = drive(
        tmp_path, ["stuck", "once", "a", "b"], actors, max_attempts=2, job_timeout=0.02
    )
    assert sorted(order) == [0, 1, 2, 3]
    assert [records[p]["status"] for p in ("once", "a", "b")] == ["done"] * 3
    once = records["once"]
    assert once["attempts"] == 2 and "after --job-timeout 0.02 s; stopped" in once["retries"][0]["error"]
    stuck = records["stuck"]
    assert stuck["status"] == "failed" and len(stuck["retries"]) == 2
    assert stuck["error"].endswith("after --job-timeout 0.02 s; stopped; gave up after 2 attempt(s)")
    hung = [a for a in actors.made if a.killed]
    assert len(hung) == 3  # stuck twice, once once: each hung worker stopped, none reused


# ------------------------------------------------------------------------------------------------
# Batches on a local Ray instance (2 CPUs, tiny model): workers, killed workers, Ctrl-C and resume.


def manifest(out):
    return [json.loads(line) for line in (out / "manifest.jsonl").read_text().splitlines()]


def files(out):
    return sorted(p.name for p in out.iterdir())


@pytest.mark.slow
def test_cli_batch_on_two_workers_with_a_killed_worker(tmp_path, ray_local, monkeypatch):
    """A worker dies (os._exit) right after staging a video: its job reruns on the other worker
    and is done, every job ends exactly once in the manifest, and no staged or partial file
    survives. (Jobs that kill every worker, load failures, limits: test_queue.py.)"""
    monkeypatch.setenv(failpoints.ENV, "job-staged=KILL ONCE:1")
    shots = tmp_path / "shots.yaml"
    shots.write_text(
        "defaults:\n  steps: 1\njobs:\n"
        "  - prompt: a red panda\n    output: shot-1\n"
        "  - prompt: KILL ONCE a fox in snow\n    output: shot-2\n"
        "  - prompt: waves at sunset\n    output: shot-3\n"
        "  - prompt: a lighthouse\n    output: shot-4\n"
        "  - prompt: a night market\n    output: shot-5\n"
    )
    out = tmp_path / "out"
    args = ["generate", str(shots), "--out", str(out), "--workers", "2", "--no-progress"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "5 done, 0 skipped, 0 failed" in result.stdout
    assert "ran on " in result.stdout and "1 job(s) retried after a worker died" in result.stdout
    assert "node(s) of the Ray cluster at " in result.stdout  # which cluster: here ray_local's instance
    assert "died during the job" in result.stderr and "retrying job" in result.stderr
    assert "(raylet)" not in result.output and "Token authentication" not in result.output  # Ray's own noise

    records = manifest(out)
    assert len(records) == 5 and len({r["job_id"] for r in records}) == 5  # each job exactly once
    assert {r["status"] for r in records} == {"done"}
    (killed,) = [r for r in records if r["prompt"].startswith("KILL")]
    assert killed["attempts"] == 2 and len(killed["retries"]) == 1
    assert killed["retries"][0]["worker"]["pid"] != killed["worker"]["pid"]  # another worker took it
    assert all(r["attempts"] == 1 for r in records if r is not killed)
    assert all(r["worker"]["node"] for r in records)
    assert files(out) == ["manifest.jsonl", *(f"shot-{i}.mp4" for i in range(1, 6))]


@pytest.mark.slow
def test_interrupt_keeps_finished_jobs_and_rerun_resumes(tmp_path, ray_local, monkeypatch):
    """Ctrl-C while the driver waits for workers, after one job is recorded: workers stop, the
    finished video stays, nothing half done remains. The same batch again (here in one process:
    job ids do not depend on where jobs run) runs only the rest."""
    import ray

    from sagevideo.outputs.manifest import Manifest

    real_append, real_wait = Manifest.append, ray.wait
    appended, interrupted = [], []

    def append(self, record):
        real_append(self, record)
        appended.append(record)

    def wait(*args, **kwargs):
        if appended and not interrupted:
            interrupted.append(True)
            raise KeyboardInterrupt  # Ctrl-C while the driver waits for the workers
        return real_wait(*args, **kwargs)

    prompts = [f"shot number {i}" for i in range(4)]
    out = tmp_path / "out"
    monkeypatch.setattr(Manifest, "append", append)
    monkeypatch.setattr(ray, "wait", wait)
    with pytest.raises(BatchInterrupted) as stop:  # one worker on ray_local's instance
        sagevideo.generate(prompts, out=out, address="auto", workers=1, steps=1, progress=False)
    report = stop.value.report
    assert report.interrupted and report.done == 1
    assert "interrupted after 1 done" in report.summary_line() and "re-run the same command" in report.summary_line()
    (first,) = manifest(out)
    assert files(out) == sorted(["manifest.jsonl", first["outputs"][0]])
    stamp = (out / first["outputs"][0]).stat().st_mtime_ns

    monkeypatch.undo()
    records = sagevideo.generate(prompts, out=out, steps=1, progress=False)
    assert [r["status"] for r in records] == ["done"] * 4
    assert first in records and (out / first["outputs"][0]).stat().st_mtime_ns == stamp
    lines = manifest(out)
    assert len(lines) == 4 and len({r["job_id"] for r in lines}) == 4
    assert files(out) == sorted(["manifest.jsonl", *(r["outputs"][0] for r in records)])
    assert not [name for name in os.listdir(out) if name.startswith(".")]


@pytest.mark.slow
def test_ray_workers_report_steps_and_write_png_frames(tmp_path, ray_local, monkeypatch):
    """Step progress crosses from the worker to the driver's bar; a frames_png job's PNG folder is
    staged by the worker and committed by the driver with its mp4."""
    from sagevideo.scheduling import progress

    texts = []
    real_init = progress.StepStatus.__init__

    def init(self, steps_queue, status):
        real_init(self, steps_queue, lambda text: (texts.append(text), status(text)))

    monkeypatch.setattr(progress.StepStatus, "__init__", init)
    out = tmp_path / "out"
    jobs = [{"prompt": "a fox", "frames_png": True, "output": "fox"}, {"prompt": "a cat", "output": "cat"}]
    records = sagevideo.generate(jobs, out=out, address="auto", workers=1, steps=3, progress=False)
    assert [r["status"] for r in records] == ["done", "done"] and records[0]["worker"]["node"]
    assert records[0]["outputs"] == ["fox.mp4", "fox_frames"] and records[1]["outputs"] == ["cat.mp4"]
    assert len(list((out / "fox_frames").glob("frame_*.png"))) == 9
    assert files(out) == ["cat.mp4", "fox.mp4", "fox_frames", "manifest.jsonl"]
    assert "cat 3/3" in texts and all(t.split()[-1] in ("1/3", "2/3", "3/3") for t in texts)
