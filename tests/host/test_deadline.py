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
    start = time.monotonic()
    first, second = sagevideo.generate(["a cat", "a dog"], out=tmp_path, job_timeout=0.2, progress=False)
    assert time.monotonic() - start < 4  # both stopped at the limit, not after the step
    assert first["status"] == second["status"] == "failed"
    assert first["error"] == "JobTimeoutError: ran past --job-timeout 0.2 s (stopped mid-job after 0 s)"
