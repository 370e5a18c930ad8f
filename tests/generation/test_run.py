"""Running a planned batch (`generation/run.py`) on the tiny model: resume, failures recorded and
retried, frames, step reports and --job-timeout; and when things go wrong: full disks, file-size
limits, a manifest that cannot be written, changed jobs that keep their output name, SIGTERM, SIGHUP
and Ctrl-C at every stage of a job, and a stop signal whose exception a library lost."""

import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import imageio.v2 as imageio
import pytest
from typer.testing import CliRunner

import sagevideo
from sagevideo.cli.app import app
from sagevideo.generation.generate import BatchStopped, plan_batch, run_batch

ROOT = Path(__file__).resolve().parents[2]
ENV = {
    **os.environ,
    "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    "HF_HUB_OFFLINE": "1",
}
FAST = ["--steps", "1", "--attention", "full", "--no-progress"]  # the tiny model's quickest job


def generate_cli(*args) -> list[str]:
    return [sys.executable, "-m", "sagevideo", "generate", *map(str, args)]


def write_jobs(path: Path, jobs: list[dict]) -> Path:
    path.write_text(json.dumps({"jobs": jobs}))  # JSON is YAML
    return path


def _can_mount_tmpfs() -> bool:
    return os.geteuid() == 0 and shutil.which("unshare") is not None and sys.platform.startswith("linux")


def manifest_lines(out):
    return [json.loads(line) for line in (out / "manifest.jsonl").read_text().splitlines()]


@pytest.fixture
def failing_prompt(monkeypatch):
    """Jobs whose prompt contains 'FAIL' raise inside the runner."""
    import sagevideo.pipelines.runner as runner

    real = runner.run_job

    def run_job(pipe, job, **kwargs):
        if "FAIL" in job.prompt:
            raise RuntimeError("simulated failure")
        return real(pipe, job, **kwargs)

    monkeypatch.setattr(runner, "run_job", run_job)


def test_rerun_resumes_without_loading_or_rewriting(tmp_path, monkeypatch):
    out = tmp_path / "out"
    first = sagevideo.generate(["a cat", "a dog"], out=out, progress=False)
    stamps = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    import sagevideo.pipelines.loading as loading

    monkeypatch.setattr(loading, "load_pipeline", lambda *a, **k: pytest.fail("loaded a model to skip jobs"))
    second = sagevideo.generate(["a cat", "a dog"], out=out, progress=False)
    assert second == first
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == stamps
    assert len(manifest_lines(out)) == 2


def test_failed_job_is_recorded_others_finish_and_rerun_retries_it(tmp_path, monkeypatch, failing_prompt):
    out = tmp_path / "out"
    records = sagevideo.generate(["a cat", "please FAIL", "a dog"], out=out, progress=False)
    assert [r["status"] for r in records] == ["done", "failed", "done"]
    failed = records[1]
    assert failed["error"] == "RuntimeError: simulated failure" and failed["outputs"] == []
    assert len(list(out.glob("*.mp4"))) == 2
    stamps = {p.name: p.stat().st_mtime_ns for p in out.glob("*.mp4")}

    monkeypatch.undo()  # the failure is fixed
    again = sagevideo.generate(["a cat", "please FAIL", "a dog"], out=out, progress=False)
    assert [r["status"] for r in again] == ["done", "done", "done"]
    assert again[0] == records[0] and again[2] == records[2]
    assert {p.name: p.stat().st_mtime_ns for p in out.glob("*.mp4") if p.name in stamps} == stamps
    assert [r["status"] for r in manifest_lines(out)] == ["done", "failed", "done", "done"]


def test_missing_output_is_redone(tmp_path):
    out = tmp_path / "out"
    first = sagevideo.generate(["a cat", "a dog"], out=out, progress=False)
    (out / first[0]["outputs"][0]).unlink()
    kept = out / first[1]["outputs"][0]
    stamp = kept.stat().st_mtime_ns
    second = sagevideo.generate(["a cat", "a dog"], out=out, progress=False)
    assert second[0]["created"] >= first[0]["created"] and second[1] == first[1]
    assert (out / first[0]["outputs"][0]).is_file() and kept.stat().st_mtime_ns == stamp
    assert len(manifest_lines(out)) == 3


def test_non_finite_frames_fail_the_job(tmp_path, monkeypatch):
    from diffusers import CogVideoXPipeline

    real = CogVideoXPipeline.decode_latents
    monkeypatch.setattr(CogVideoXPipeline, "decode_latents", lambda self, x: real(self, x) * float("nan"))
    (record,) = sagevideo.generate("a cat", out=tmp_path, progress=False)
    assert record["status"] == "failed"
    assert record["error"].startswith("NonFiniteError: NaN/Inf in the decoded frames")
    assert not list(tmp_path.glob("*.mp4")) and not list(tmp_path.glob(".*"))


def test_full_attention_installs_nothing(tmp_path):
    from sagevideo.generation.generate import run_batch

    plan = plan_batch(["a cat"], out=tmp_path, attention="full")
    report = run_batch(plan, progress=False)
    (record,) = report.records
    assert (record["attention"], record["backend"], record["pv"]) == ("full", None, None)
    assert record["backends"] == {"counts": {}, "fallbacks": {}}
    assert "full precision (nothing installed)" in report.summary_line()


def test_frames_png_writes_a_folder_per_job_and_resume_checks_it(tmp_path):
    out = tmp_path / "out"
    plain, with_pngs = sagevideo.generate(
        ["a cat", {"prompt": "a dog", "frames_png": True, "output": "dog"}], out=out, progress=False
    )
    assert len(plain["outputs"]) == 1 and with_pngs["outputs"] == ["dog.mp4", "dog_frames"]
    pngs = sorted((out / "dog_frames").iterdir())
    assert [p.name for p in pngs] == [f"frame_{i:05d}.png" for i in range(9)]
    with imageio.get_reader(out / "dog.mp4") as reader:
        first = next(iter(reader))
    png = imageio.imread(pngs[0])
    assert png.shape == (64, 64, 3) and abs(png.astype(int) - first.astype(int)).mean() < 12  # mp4 is lossy
    # The id of a job without PNGs did not change with the new field (older manifests still match).
    assert plain["job_id"] == plan_batch("a cat", out=tmp_path / "x").jobs[0].job_id
    # A missing frames folder makes the job pending again.
    for p in pngs:
        p.unlink()
    (out / "dog_frames").rmdir()
    again = sagevideo.generate(
        ["a cat", {"prompt": "a dog", "frames_png": True, "output": "dog"}], out=out, progress=False
    )
    assert again[0] == plain and again[1]["created"] >= with_pngs["created"]
    assert len(list((out / "dog_frames").iterdir())) == 9
    assert not [p for p in out.iterdir() if p.name.startswith(".")]


def test_steps_are_reported_and_a_job_past_job_timeout_fails(tmp_path, monkeypatch):
    from sagevideo.generation import run as gen

    seen = []
    real = gen._step_watch

    def watch(pj, status, limit_s):
        return real(pj, lambda text: (seen.append(text), status(text)), limit_s)

    monkeypatch.setattr(gen, "_step_watch", watch)
    (done,) = sagevideo.generate("a cat", out=tmp_path / "a", steps=3, progress=False)
    assert done["status"] == "done" and [s.split()[-1] for s in seen] == ["1/3", "2/3", "3/3"]

    (late,) = sagevideo.generate("a cat", out=tmp_path / "b", steps=3, job_timeout=1e-9, progress=False)
    assert late["status"] == "failed" and late["attempts"] == 1
    # the elapsed seconds round to 0 or more on a loaded machine
    assert re.fullmatch(r"JobTimeoutError: ran past --job-timeout 1e-09 s \(stopped mid-job after \d+ s\)",
                        late["error"])
    assert not list((tmp_path / "b").glob("*.mp4"))


def test_file_size_limit_fails_the_job_that_hits_it_and_keeps_nothing_under_its_name(tmp_path, monkeypatch):
    """The encoder under `ulimit -f 40` (the path a quota takes; set in the child process only, so
    this test runs in one process): the small video fits and is done, the big one is recorded
    failed with the reason, nothing of it is left, exit 1. Before, the cut-off video was done."""
    import functools

    real_popen = subprocess.Popen
    limit = 40 * 1024  # the small video takes ~21 kB, the big one ~78 kB
    preexec = lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    monkeypatch.setattr(subprocess, "Popen", functools.partial(real_popen, preexec_fn=preexec))
    jobs = write_jobs(
        tmp_path / "shots.yaml",
        [{"prompt": "small", "output": "small"}, {"prompt": "big", "output": "big", "resolution": "128x128"}],
    )
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["generate", str(jobs), "--out", str(out), *FAST])
    assert result.exit_code == 1, result.output
    assert "failed: VideoWriteError: big.mp4 not written: file-size limit reached (EFBIG" in result.stderr
    assert "1 done, 0 skipped, 1 failed" in result.stdout
    small, big = manifest_lines(out)
    assert (small["status"], small["outputs"]) == ("done", ["small.mp4"])
    assert big["status"] == "failed" and "file-size limit reached" in big["error"] and big["outputs"] == []
    assert sorted(os.listdir(out)) == ["manifest.jsonl", "small.mp4"]


@pytest.mark.slow
@pytest.mark.skipif(not _can_mount_tmpfs(), reason="needs root and unshare(1) to mount a private tmpfs")
def test_full_disk_fails_the_job_records_why_and_stops_the_batch(tmp_path):
    """A 40 kB tmpfs in a private mount namespace (gone when the command ends): the first video
    fits, the second hits ENOSPC and is recorded failed, and the batch stops there (every later
    job would fail the same way after its whole render); exit 1, the summary says it."""
    out, copy = tmp_path / "out", tmp_path / "copy"
    out.mkdir()
    copy.mkdir()
    command = " ".join(f"'{a}'" for a in generate_cli("-p", "one", "-p", "two", "-p", "three", "--out", out, *FAST))
    script = (
        f"mount -t tmpfs -o size=40k tmpfs '{out}' || exit 97\n"
        f"{command} > '{tmp_path}/stdout' 2> '{tmp_path}/stderr'; echo $? > '{tmp_path}/rc'\n"
        f"cp -a '{out}/.' '{copy}/'\n"
    )
    done = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script], env=ENV, timeout=300)
    if done.returncode == 97:
        pytest.skip("cannot mount a tmpfs here")
    stdout, stderr = (tmp_path / "stdout").read_text(), (tmp_path / "stderr").read_text()
    assert (tmp_path / "rc").read_text().strip() == "1", stderr
    assert "Traceback" not in stderr and "not written: disk full (ENOSPC)" in stderr
    assert "stopped after 1 done, 0 skipped, 1 failed" in stdout
    assert "later jobs would fail the same way" in stdout and "re-run the same command to resume" in stdout
    first, second = manifest_lines(copy)
    assert first["status"] == "done" and second["status"] == "failed" and "disk full (ENOSPC)" in second["error"]
    assert sorted(os.listdir(copy)) == sorted(["manifest.jsonl", first["outputs"][0]])


def test_manifest_that_cannot_be_written_undoes_the_rename_and_stops(tmp_path, monkeypatch):
    """The second job's line hits a full disk: its video leaves the final name again (a final name
    holds only what the manifest vouches for), the batch stops, a re-run renders it."""
    import errno

    from sagevideo.outputs.manifest import Manifest, ManifestWriteError

    real_append = Manifest.append
    calls = []

    def append(self, record):
        calls.append(record["job_id"])
        if len(calls) == 2:
            raise ManifestWriteError(f"{self.path}: a record could not be written (disk full (ENOSPC))", errno.ENOSPC)
        real_append(self, record)

    monkeypatch.setattr(Manifest, "append", append)
    out = tmp_path / "out"
    prompts = ["a cat", "a dog"]
    with pytest.raises(BatchStopped) as stopped:
        sagevideo.generate(prompts, out=out, steps=1, attention="full", progress=False)
    report = stopped.value.report
    assert (report.done, report.failed) == (1, 0) and "disk full (ENOSPC)" in report.stopped
    assert "stopped after 1 done" in report.summary_line()
    (first,) = manifest_lines(out)
    assert sorted(os.listdir(out)) == sorted(["manifest.jsonl", first["outputs"][0]])  # no unrecorded video

    monkeypatch.undo()
    records = sagevideo.generate(prompts, out=out, steps=1, attention="full", progress=False)
    assert [r["status"] for r in records] == ["done"] * 2 and records[0] == first


def test_changed_job_keeps_the_earlier_render_under_a_new_name(tmp_path):
    """A job with a fixed output name whose prompt changed: the new render takes the name, the
    earlier mp4 and PNG folder are renamed (not overwritten), the earlier job's record says where
    they went, the summary says it; running the same file again moves nothing."""
    out = tmp_path / "out"
    job = {"prompt": "a red panda", "output": "shot", "frames_png": True}
    plan = plan_batch([job], out=out, steps=1, attention="full")
    first = run_batch(plan, progress=False).records[0]
    old_bytes = (out / "shot.mp4").read_bytes()

    changed = plan_batch([{**job, "prompt": "a red panda, at night"}], out=out, steps=1, attention="full")
    lines = []
    report = run_batch(changed, progress=False, echo=lines.append)
    tag = first["job_id"][:10]
    kept_mp4, kept_frames = f"shot.was-{tag}.mp4", f"shot.was-{tag}_frames"
    assert report.done == 1 and report.kept == [("shot.mp4", kept_mp4), ("shot_frames", kept_frames)]
    assert f"shot.mp4 → {kept_mp4}" in report.summary_line()
    assert any(f"kept as {kept_mp4}" in line and first["job_id"] in line for line in lines)
    assert (out / kept_mp4).read_bytes() == old_bytes and (out / "shot.mp4").read_bytes() != old_bytes
    assert len(list((out / kept_frames).glob("frame_*.png"))) == 9
    old_again, new = manifest_lines(out)[1:]
    assert old_again["job_id"] == first["job_id"] and old_again["outputs"] == [kept_mp4, kept_frames]
    assert new["outputs"] == ["shot.mp4", "shot_frames"] and new["prompt"] == "a red panda, at night"
    assert sorted(os.listdir(out)) == sorted(["manifest.jsonl", "shot.mp4", "shot_frames", kept_mp4, kept_frames])

    again = run_batch(changed, progress=False)
    assert (again.done, again.skipped, again.kept) == (0, 1, [])


@pytest.mark.slow
def test_sigterm_stops_like_ctrl_c_with_summary_and_its_exit_status(tmp_path, stop_signals_delivered):
    """What SLURM and Kubernetes send: the run stops between (or in the middle of) jobs, keeps every
    finished video with its line, prints the summary with the resume hint, exits 143 (128 + 15) as a
    shell reports it. Before, the process died at once (no summary, no hint). SIGHUP takes the same
    path: the closed-terminal test below (exit 129, what finished kept) and, with its summary line,
    tests/scheduling/test_cluster.py's SIGHUP to a driver's process group."""
    out = tmp_path / "out"
    prompts = [arg for i in range(8) for arg in ("-p", f"shot {i}")]
    run = subprocess.Popen(
        generate_cli(*prompts, "--out", out, *FAST), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=ENV,
    )
    manifest = out / "manifest.jsonl"
    deadline = time.monotonic() + 240
    while not (manifest.exists() and manifest.stat().st_size) and run.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)  # waiting on another process: the first job's line
    run.send_signal(signal.SIGTERM)
    stdout, stderr = run.communicate(timeout=120)
    assert run.returncode == 143, stderr
    assert "Traceback" not in stderr
    records = manifest_lines(out)
    assert stdout.startswith(f"sagevideo: terminated (SIGTERM) after {len(records)} done, 0 skipped, 0 failed")
    assert stdout.strip().endswith("re-run the same command to resume")
    assert 1 <= len(records) < 8 and {r["status"] for r in records} == {"done"}
    assert sorted(os.listdir(out)) == sorted(["manifest.jsonl", *(r["outputs"][0] for r in records)])


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a pseudo-terminal closed under the run")
def test_a_closed_terminal_stops_the_run_with_exit_129_and_keeps_what_finished(tmp_path, stop_signals_delivered):
    """The run's terminal (a pseudo-terminal here) closes, as when an ssh session drops: the kernel
    sends SIGHUP, and every later write to the terminal fails (EIO). The run stops as for SIGTERM,
    exits 129, keeps each finished video with its line and leaves nothing staged. Before, SIGHUP
    killed it at once; then the summary's write to the gone terminal raised: exit 1, a traceback."""
    import pty
    import select

    out = tmp_path / "out"
    prompts = [arg for i in range(8) for arg in ("-p", f"shot {i}")]
    command = generate_cli(*prompts, "--out", out, "--steps", "1", "--attention", "full")
    pid, terminal = pty.fork()  # the child leads a session whose controlling terminal is the pty
    if pid == 0:
        try:
            os.execve(command[0], command, ENV)
        finally:
            os._exit(127)
    manifest = out / "manifest.jsonl"
    deadline = time.monotonic() + 240
    while not (manifest.exists() and manifest.stat().st_size) and time.monotonic() < deadline:
        if select.select([terminal], [], [], 0.05)[0]:
            os.read(terminal, 65536)  # what the run shows (its bar): read, or its writes would block
    os.close(terminal)  # the terminal goes away
    deadline = time.monotonic() + 120
    while (ended := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    if ended[0] == 0:
        os.kill(pid, signal.SIGKILL)
        ended = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(ended[1]) == 129
    records = manifest_lines(out)
    assert 1 <= len(records) < 8 and {r["status"] for r in records} == {"done"}
    assert sorted(os.listdir(out)) == sorted(["manifest.jsonl", *(r["outputs"][0] for r in records)])


# (stage of the signalled job, signal, whether that job is recorded done: its commit had begun)
SIGNAL_STAGES = [
    ("denoise", "SIGTERM", False),
    ("decode", "SIGTERM", False),
    ("encode", "SIGINT", False),
    ("read-back", "SIGTERM", False),
    ("read-back-lost", "SIGTERM", False),
    ("staged", "SIGHUP", False),
    ("commit", "SIGTERM", True),
    ("manifest", "SIGINT", True),
]
STOP_S = 10.0  # from the signal to the process's end: the stop itself takes well under a second


@pytest.mark.slow
def test_a_signal_at_any_stage_of_a_job_stops_the_run_within_seconds_and_nothing_is_recorded_failed(
    tmp_path, monkeypatch, stop_signals_delivered
):
    """Run after run of one batch, each signalled once at one stage of its next job
    (tests/helpers/signal_stage.py), and each resuming the last: every run exits 128 + the signal
    within seconds of it, with the summary; every job it finished is recorded done (the signalled
    one only when its commit had begun), none failed, no staged file is left; a last run, not
    signalled, finishes the batch with every job recorded done once. Before, a SIGTERM whose
    exception was lost in the read-back (as CPython's fork hooks lost it under imageio's reader)
    let the run render on to the end, and the job was recorded failed ("holds 0 of 9 frames").
    The runs are the CLI in this process, the signal sent to it (one process less per run: a
    process of its own each costs seconds of imports); a real process's exit status and signals
    are the tests above."""
    from tests.helpers import signal_stage

    out = tmp_path / "out"
    prompts = [arg for i in range(len(SIGNAL_STAGES)) for arg in ("-p", f"job{i} a red fox")]
    args = ["generate", *prompts, "--out", str(out), "--steps", "2", "--attention", "full", "--no-progress"]
    sent = tmp_path / "sent"
    for i, (stage, name, committed) in enumerate(SIGNAL_STAGES):
        sent.unlink(missing_ok=True)
        with monkeypatch.context() as patched:
            signal_stage.arm(stage, name, f"job{i}", sent, patched.setattr, patched.setenv)
            run = CliRunner().invoke(app, args)
        ended = time.time()
        assert run.exit_code == 128 + getattr(signal, name), (stage, run.output, run.exception, stop_signals_delivered)
        assert isinstance(run.exception, SystemExit), (stage, run.exception)  # no other exception escaped
        assert ended - float(sent.read_text()) < STOP_S, stage
        assert "Traceback" not in run.output, (stage, run.output)
        records = manifest_lines(out) if (out / "manifest.jsonl").exists() else []
        assert [r["status"] for r in records] == ["done"] * (i + committed), (stage, records[-1:])
        assert len({r["job_id"] for r in records}) == len(records)  # each job committed once
        state = "interrupted" if name == "SIGINT" else f"terminated ({name})"
        assert re.search(rf"^sagevideo: {re.escape(state)} after \d+ done, \d+ skipped, 0 failed", run.output,
                         re.MULTILINE), (stage, run.output)
        assert run.output.strip().endswith("re-run the same command to resume")
        left = sorted(os.listdir(out))
        assert left == sorted([*(["manifest.jsonl"] if records else []), *(r["outputs"][0] for r in records)]), stage
    last = CliRunner().invoke(app, args)
    assert last.exit_code == 0, last.output
    records = manifest_lines(out)
    assert [r["status"] for r in records] == ["done"] * len(SIGNAL_STAGES)
    assert len({r["job_id"] for r in records}) == len(SIGNAL_STAGES)


def test_a_run_under_nohup_goes_on_through_a_hangup(tmp_path, monkeypatch, stop_signals_delivered):
    """`nohup sagevideo generate ...` starts the run with SIGHUP ignored: a hangup in the middle of a
    job (the terminal closing) must not stop it, since the user asked for exactly that. The run leaves
    an ignored stop signal ignored, finishes every job and exits 0; SIGHUP stays ignored afterwards."""
    from tests.helpers import signal_stage

    out = tmp_path / "out"
    args = ["generate", "-p", "job0 a red fox", "-p", "job1 a red fox", "--out", str(out), "--steps", "2",
            "--attention", "full", "--no-progress"]
    sent = tmp_path / "sent"
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # as nohup leaves it (the fixture puts it back)
    signal_stage.arm("denoise", "SIGHUP", "job0", sent, monkeypatch.setattr, monkeypatch.setenv)
    run = CliRunner().invoke(app, args)
    assert sent.exists(), "the hangup was never sent"
    assert run.exit_code == 0, (run.output, run.exception)
    assert [r["status"] for r in manifest_lines(out)] == ["done", "done"]
    assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN


def test_a_killed_runs_marker_is_removed_by_the_next_run(tmp_path):
    """kill -9 of a Ray driver leaves its `.sagevideo-run-*` marker (nothing in-process can run then);
    the next run into the folder, holding its lock, removes it. Before, such markers stayed for good."""
    out = tmp_path / "out"
    out.mkdir()
    (out / ".sagevideo-run-1a2b3c4d").touch()

    def execute(plan, todo, status):
        yield from ()

    plan = plan_batch(["a fox"], out=out, steps=1, attention="full", progress=False)
    run_batch(plan, progress=False, execute=execute)
    assert os.listdir(out) == []


def _lose_a_sigterm() -> None:
    """A SIGTERM whose exception a library loses (CPython discards it in a fork hook or a __del__)."""
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.1)  # the handler raises here
    except KeyboardInterrupt:
        pass


@pytest.mark.parametrize("where, kept", [("denoise", 1), ("read-back", 1), ("staged", 2)])
def test_a_sigterm_whose_exception_was_lost_still_stops_the_run_at_its_next_checkpoint(
    tmp_path, monkeypatch, where, kept
):
    """Lost during job 2's denoising, the signal stops the run at the next step (the job is
    abandoned); lost in its read-back while the read came back empty, the job's failure (which the
    signal may have caused) is not recorded; lost after the job was staged whole, the job is
    committed, then the run stops. A re-run resumes. Before, the run rendered the whole batch, and
    the read-back's job was recorded failed ("the encoded file holds 0 of 9 frames")."""
    import sagevideo.host.pipeline_host as host
    import sagevideo.outputs.video as video
    import sagevideo.pipelines.runner as runner
    from sagevideo.generation.run import BatchInterrupted

    real_run, real_run_job, real_count = host.PipelineHost.run, runner.run_job, video.count_frames
    current = [""]

    def run(self, pj, **kwargs):
        current[0] = pj.job.prompt
        record = real_run(self, pj, **kwargs)
        if where == "staged" and "job 2" in pj.job.prompt:
            _lose_a_sigterm()
        return record

    def run_job(pipe, job, *, on_step=None, **kwargs):
        def step(i, steps):
            on_step(i, steps)
            if where == "denoise" and "job 2" in job.prompt and i == 1:
                _lose_a_sigterm()

        return real_run_job(pipe, job, on_step=step, **kwargs)

    def count_frames(path):
        if where == "read-back" and "job 2" in current[0]:
            _lose_a_sigterm()
            return 0  # the reader the signal broke
        return real_count(path)

    monkeypatch.setattr(host.PipelineHost, "run", run)
    monkeypatch.setattr(runner, "run_job", run_job)
    monkeypatch.setattr(video, "count_frames", count_frames)
    out = tmp_path / "out"
    plan = plan_batch(["job 1", "job 2", "job 3"], out=out, steps=2, attention="full", progress=False)
    with pytest.raises(BatchInterrupted) as stop:
        run_batch(plan, progress=False)
    assert stop.value.report.signal == "SIGTERM" and stop.value.report.done == kept
    assert [r["status"] for r in manifest_lines(out)] == ["done"] * kept
    assert sorted(os.listdir(out)) == sorted(["manifest.jsonl", *(r["outputs"][0] for r in manifest_lines(out))])
    monkeypatch.undo()
    again = run_batch(plan, progress=False)
    assert (again.done, again.skipped, again.failed) == (3 - kept, kept, 0)


def test_sigterm_that_a_library_re_raises_as_a_plain_keyboard_interrupt_still_says_sigterm(tmp_path):
    """Inside Ray's blocking calls the `Terminated` our SIGTERM handler raises comes out as a plain
    KeyboardInterrupt; the report (and so the exit status, 143) must still say SIGTERM."""
    from sagevideo.generation.run import BatchInterrupted, Terminated

    def execute(plan, todo, status):
        try:
            os.kill(os.getpid(), signal.SIGTERM)  # the handler raises Terminated here
            time.sleep(5)
        except Terminated:
            raise KeyboardInterrupt from None  # what Ray's C++ core makes of it
        yield from ()

    plan = plan_batch(["a fox"], out=tmp_path / "out", steps=1, attention="full", progress=False)
    with pytest.raises(BatchInterrupted) as err:
        run_batch(plan, progress=False, execute=execute)
    assert err.value.report.signal == "SIGTERM"


def test_a_folder_a_newer_sagevideo_wrote_is_refused_not_redone(tmp_path, monkeypatch):
    """A finished job recorded by a newer sagevideo (manifest schema 3): this version cannot read
    the record, so before it set the line aside and rendered the job again; now it refuses to
    write there, exit 2, before loading, and leaves the folder as it was."""
    out = tmp_path / "out"
    jobs = write_jobs(tmp_path / "shots.yaml", [{"prompt": "a cat", "output": "cat"}])
    assert CliRunner().invoke(app, ["generate", str(jobs), "--out", str(out), *FAST]).exit_code == 0
    (record,) = manifest_lines(out)
    (out / "manifest.jsonl").write_text(json.dumps({**record, "schema": 3, "made_with": "sagevideo 0.9"}) + "\n")
    before = {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in out.iterdir() if p.is_file()}
    import sagevideo.pipelines.loading as loading

    monkeypatch.setattr(loading, "load_pipeline", lambda *a, **k: pytest.fail("loaded a model"))
    result = CliRunner().invoke(app, ["generate", str(jobs), "--out", str(out), *FAST])
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.strip().splitlines()
    assert "manifest.jsonl line 1 was written by a newer sagevideo (manifest schema 3;" in line
    assert "reads and writes schema 2)" in line and "Traceback" not in result.output
    assert {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in out.iterdir() if p.is_file()} == before
