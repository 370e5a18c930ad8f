"""A `sagevideo generate` run that signals its own process at one stage of one job (for
tests/generation/test_run.py): `arm(stage, signal, part, sent, patch, setenv)` with monkeypatch's
setattr/setenv, then the CLI in the test's process.

The signal (SIGTERM, SIGINT or SIGHUP) goes to the process once, at STAGE of the job whose prompt
contains `part`; the time it was sent is written to the file `sent`. Stages:
- denoise: after the job's first denoising step (its on_step);
- decode: as the VAE's decoder starts (a forward pre-hook);
- encode, read-back: sent by ffmpeg itself (a wrapper script as IMAGEIO_FFMPEG_EXE) while this
  process waits for the encoder, or for the decoder that reads the new video back;
- read-back-lost: as the read-back starts, and its exception lost (a library that catches it, as
  CPython's fork hooks did), while the read comes back empty, as a reader the signal broke;
- staged: after the job's outputs are staged, before the driver commits them;
- commit: as the video is renamed into place; manifest: as its manifest line is appended.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def arm(stage: str, name: str, part: str, sent: Path, patch: Callable[[Any, str, Any], None],
        setenv: Callable[[str, str], None]) -> None:
    """Make the process signal itself once at `stage` of the job whose prompt holds `part`: sagevideo's
    functions replaced through `patch(owner, name, value)`, the encoder through `setenv`."""
    signum = getattr(signal, name)
    fired = [False]

    def send() -> None:
        if not fired[0]:
            fired[0] = True
            sent.write_text(repr(time.time()))
            os.kill(os.getpid(), signum)

    current = [""]  # the prompt of the job in this process's hands
    import sagevideo.host.pipeline_host as host
    import sagevideo.pipelines.runner as runner

    real_run, real_run_job = host.PipelineHost.run, runner.run_job

    def run(self, pj, **kwargs):
        current[0] = pj.job.prompt
        record = real_run(self, pj, **kwargs)
        if stage == "staged" and part in pj.job.prompt:
            send()
        return record

    def run_job(pipe, job, *, on_step=None, **kwargs):
        hooks = []
        if part in job.prompt and stage == "denoise":
            def on_step_then_signal(step, steps):
                if on_step is not None:
                    on_step(step, steps)
                send()

            return real_run_job(pipe, job, on_step=on_step_then_signal, **kwargs)
        if part in job.prompt and stage == "decode":
            hooks.append(pipe.vae.decoder.register_forward_pre_hook(lambda module, inputs: send()))
        try:
            return real_run_job(pipe, job, on_step=on_step, **kwargs)
        finally:
            for hook in hooks:
                hook.remove()

    patch(host.PipelineHost, "run", run)
    patch(runner, "run_job", run_job)
    if stage in ("encode", "read-back"):
        setenv("IMAGEIO_FFMPEG_EXE", _ffmpeg_that_signals(stage, signum, part, sent))
    if stage == "read-back-lost":
        import sagevideo.outputs.video as video

        real_count = video.count_frames

        def count_frames(path):
            if part not in current[0]:
                return real_count(path)
            try:
                send()
                time.sleep(0.1)  # the handler raises here: a signal between two bytecodes
            except KeyboardInterrupt:
                pass  # ... and a library that swallows what it raised
            return 0

        patch(video, "count_frames", count_frames)
    if stage in ("commit", "manifest"):
        import sagevideo.outputs.manifest as manifest
        import sagevideo.outputs.staging as staging

        owner, attr = (staging, "commit") if stage == "commit" else (manifest.Manifest, "append")
        real = getattr(owner, attr)

        def signal_then(*a, **kw):
            if part in current[0]:
                send()
            return real(*a, **kw)

        patch(owner, attr, signal_then)


def _ffmpeg_that_signals(stage: str, signum: int, part: str, sent: Path) -> str:
    """For IMAGEIO_FFMPEG_EXE: a script that, run for this job's encode (its arguments name libx264) or
    read-back (its other run on the job's file), signals this process once while it waits, then
    runs the real ffmpeg."""
    import imageio_ffmpeg

    real = imageio_ffmpeg.get_ffmpeg_exe()
    once, script = sent.with_suffix(".fired"), sent.with_name("ffmpeg-that-signals")
    once.unlink(missing_ok=True)  # (an earlier run's)
    script.write_text(f"""#!/bin/sh
case " $* " in *{part}*) ;; *) exec "{real}" "$@";; esac
case " $* " in *" libx264 "*) kind=encode;; *) kind=read-back;; esac
if [ "$kind" = "{stage}" ] && [ ! -e "{once}" ]; then
  : > "{once}"
  date +%s.%N > "{sent}"
  kill -{signal.Signals(signum).name.removeprefix("SIG")} $PPID
  sleep 0.5
fi
exec "{real}" "$@"
""")
    script.chmod(0o755)
    return str(script)
