"""`--job-timeout` inside the process: a step that never ends is stopped at the limit."""

import sagevideo


def test_job_timeout_stops_a_job_in_this_process_mid_step(tmp_path, monkeypatch):
    import time

    from sagevideo.pipelines import runner

    real = runner.run_job

    def one_endless_step(pipe, job, **kwargs):  # a step that never ends (Python work: interruptible)
        give_up = time.monotonic() + 5
        while time.monotonic() < give_up:
            pass
        return real(pipe, job, **kwargs)

    monkeypatch.setattr(runner, "run_job", one_endless_step)
    first, second = sagevideo.generate(["a cat", "a dog"], out=tmp_path, job_timeout=0.2, progress=False)
    # Both stopped at the limit, not after the 5 s step. Each job's own span is measured: the run's
    # whole time also holds planning and the model's load (imports), which vary with the machine.
    from datetime import datetime

    for record in (first, second):
        span = datetime.fromisoformat(record["created"]) - datetime.fromisoformat(record["started"])
        assert span.total_seconds() < 2.5, record
    assert first["status"] == second["status"] == "failed"
    assert first["error"] == "JobTimeoutError: ran past --job-timeout 0.2 s (stopped mid-job after 0 s)"
