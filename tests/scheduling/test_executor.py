"""Where a batch runs (`scheduling/executor.py`): this process unless Ray is asked for or needed."""

from __future__ import annotations

import pytest

from sagevideo.errors import InputError
from sagevideo.scheduling import executor


def test_one_cpu_worker_runs_here():
    assert executor.choose_executor(None, None, "cpu") == (False, [])


def test_ray_when_asked_for(monkeypatch):
    monkeypatch.setattr(executor, "ray_installed", lambda: True)
    use_ray, notes = executor.choose_executor(None, 2, "cpu")
    assert use_ray and notes == ["scheduling: Ray, on a local Ray instance"]
    use_ray, notes = executor.choose_executor("auto", None, "cpu", gpus_per_job=2)
    assert use_ray and "each job on 2 ranks (one CPU process each" in notes[1]


def test_what_cannot_run_is_refused(monkeypatch):
    with pytest.raises(InputError, match="not a Ray address"):
        executor.choose_executor("nowhere", None, "cpu")
    monkeypatch.setattr(executor, "ray_installed", lambda: False)
    with pytest.raises(InputError, match="--workers 2 needs Ray, which is not installed"):
        executor.choose_executor(None, 2, "cpu")
    with pytest.raises(InputError, match="--gpus-per-job 2 starts one process per rank through Ray"):
        executor.choose_executor(None, None, "cpu", gpus_per_job=2)
