"""Batches on a local Ray instance (2 CPUs, tiny model): workers, killed workers, Ctrl-C and resume."""

from __future__ import annotations

import json
import os

import pytest
from typer.testing import CliRunner

pytest.importorskip("ray")

import sagevideo  # noqa: E402
from sagevideo.cli.app import app  # noqa: E402
from sagevideo.generation.generate import BatchInterrupted  # noqa: E402
from sagevideo.host import failpoints  # noqa: E402

pytestmark = pytest.mark.slow  # each batch starts worker processes that import torch and diffusers


def manifest(out):
    return [json.loads(line) for line in (out / "manifest.jsonl").read_text().splitlines()]


def files(out):
    return sorted(p.name for p in out.iterdir())


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
    assert "node(s) of the Ray cluster at " in result.stdout  # which cluster: here the module's instance
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
    with pytest.raises(BatchInterrupted) as stop:  # one worker on the module's Ray instance
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


def test_ray_workers_report_steps_and_write_png_frames(tmp_path, ray_local, monkeypatch):
    """Step progress crosses from the worker to the driver's bar; a frames_png job's PNG folder is
    staged by the worker and committed by the driver with its mp4."""
    from sagevideo.scheduling import queue

    texts = []
    real_init = queue._StepStatus.__init__

    def init(self, steps_queue, status):
        real_init(self, steps_queue, lambda text: (texts.append(text), status(text)))

    monkeypatch.setattr(queue._StepStatus, "__init__", init)
    out = tmp_path / "out"
    jobs = [{"prompt": "a fox", "frames_png": True, "output": "fox"}, {"prompt": "a cat", "output": "cat"}]
    records = sagevideo.generate(jobs, out=out, address="auto", workers=1, steps=3, progress=False)
    assert [r["status"] for r in records] == ["done", "done"] and records[0]["worker"]["node"]
    assert records[0]["outputs"] == ["fox.mp4", "fox_frames"] and records[1]["outputs"] == ["cat.mp4"]
    assert len(list((out / "fox_frames").glob("frame_*.png"))) == 9
    assert files(out) == ["cat.mp4", "fox.mp4", "fox_frames", "manifest.jsonl"]
    assert "cat 3/3" in texts and all(t.split()[-1] in ("1/3", "2/3", "3/3") for t in texts)
