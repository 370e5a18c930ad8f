"""`sagevideo generate` through typer's CliRunner: exit codes, messages, summary line."""

import json
import textwrap

import imageio.v2 as imageio
import pytest
from typer.testing import CliRunner

from sagevideo.cli.app import app

runner = CliRunner()


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def invoke(*args):
    return runner.invoke(app, ["generate", *map(str, args)])


def test_generate_writes_videos_and_prints_summary(tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("# two prompts\na red panda\n\nwaves at sunset\n")
    out = tmp_path / "out"
    result = invoke(prompts, "--out", out, "--prompt", "a third one", "--no-progress")
    assert result.exit_code == 0, result.output
    assert "quantization emulation (reference/fp16)" in result.stderr
    assert result.stdout.strip() == (
        f"sagevideo: 3 done, 0 skipped, 0 failed → {out} (manifest.jsonl); attention: reference/fp16 x12"
    )
    records = [json.loads(line) for line in (out / "manifest.jsonl").read_text().splitlines()]
    assert [r["prompt"] for r in records] == ["a red panda", "waves at sunset", "a third one"]
    assert len(list(out.glob("*.mp4"))) == 3

    again = invoke(prompts, "--out", out, "--prompt", "a third one", "--no-progress")
    assert again.exit_code == 0 and "0 done, 3 skipped, 0 failed" in again.stdout


def test_the_summary_says_what_the_sparse_setting_skipped(tmp_path):
    """At the tiny model's default size a 64-token tile holds most of the video, so the static windows
    keep every tile: the summary says so, instead of leaving a user to think tiles were skipped."""
    out = tmp_path / "out"
    result = invoke("--out", out, "-p", "a fox", "--steps", "4", "--sparse", "static:0.3", "--no-progress")
    assert result.exit_code == 0, result.output
    assert result.stdout.strip().endswith(
        "attention: reference/fp16 x8; block-sparse: 3 of 8 calls at density 1.00 (every tile kept at this size or "
        "on these inputs), 5 dense by the plan")


def test_the_summary_says_the_recipe_its_warm_up_and_what_the_cache_skipped(tmp_path):
    out = tmp_path / "out"
    result = invoke("--out", out, "-p", "a fox", "-p", "a cat", "--steps", "3", "--compile", "regional",
                    "--compile-backend", "eager", "--cache", "first-block", "--cache-threshold", "5", "--no-progress")
    assert result.exit_code == 0, result.output
    line = result.stdout.strip()
    assert line.startswith(f"sagevideo: 2 done, 0 skipped, 0 failed → {out} (manifest.jsonl); attention: ")
    timings = [json.loads(r)["timings"] for r in (out / "manifest.jsonl").read_text().splitlines()]
    # the first job paid the compilation (the recipe was applied for it); each job's 3 steps: 1 run, 2 reused
    started = timings[0]["process_to_first_step_s"]  # this (test) process's start, the worker's first job only
    assert started > timings[0]["load_s"] + timings[0]["first_step_s"] and "process_to_first_step_s" not in timings[1]
    before_load = timings[0]["process_to_load_s"]  # imports and planning: inside the start-up, before the load
    assert 0 < before_load < started - timings[0]["load_s"] and "process_to_load_s" not in timings[1]
    assert f"; recipe regional/eager+first-block@5 (first step where applied: {timings[0]['first_step_s']:.1f} s, " \
           f"compilation included; worker start to its first step: {started:.1f} s; cache skipped 4 of 6 forwards)" \
           in line


@pytest.mark.slow  # torch.compile
def test_the_summary_says_how_many_compiled_graphs_came_from_the_compile_cache(tmp_path, monkeypatch):
    """The compile backend eager looks nothing up, so the caches' counters are stood in for: each
    reading finds one more graph loaded from the cache and one more compiled afresh every second
    reading. The records carry each job's lookups; the summary adds them up."""
    import itertools

    import sagevideo.pipelines.recipe.apply as recipe_module

    readings = itertools.count()

    def counts():
        n = next(readings)
        return {"fxgraph_cache_hit": n, "fxgraph_cache_miss": n // 2}

    monkeypatch.setattr(recipe_module, "compile_cache_counts", counts)
    out = tmp_path / "out"
    result = invoke("--out", out, "-p", "a fox", "-p", "a cat", "--steps", "1", "--compile", "regional",
                    "--compile-backend", "eager", "--no-progress")
    assert result.exit_code == 0, result.output
    records = [json.loads(line) for line in (out / "manifest.jsonl").read_text().splitlines()]
    lookups = [record["recipe"]["compile_cache_lookups"] for record in records]
    hits, misses = (sum(job[name] for job in lookups) for name in ("fxgraph_cache_hit", "fxgraph_cache_miss"))
    assert hits > 0
    assert f"; {hits} of {hits + misses} compiled graphs from the compile cache)" in result.stdout


def test_options_reach_the_jobs(tmp_path):
    out = tmp_path / "out"
    result = invoke(
        "--out",
        out,
        "-p",
        "x",
        "--seed",
        5,
        "--frames",
        17,
        "--height",
        32,
        "--width",
        48,
        "--steps",
        1,
        "--guidance",
        1.0,
        "--pv",
        "fp8",
        "--fps",
        4,
        "--no-progress",
    )
    assert result.exit_code == 0, result.output
    (r,) = [json.loads(line) for line in (out / "manifest.jsonl").read_text().splitlines()]
    assert (
        r["seed"],
        r["frames"],
        r["height"],
        r["width"],
        r["steps"],
        r["guidance"],
        r["pv"],
        r["fps"],
    ) == (5, 17, 32, 48, 1, 1.0, "fp8", 4)
    assert r["backends"]["counts"] == {"reference/fp8": 2}  # no CFG at guidance 1: one pass per step
    with imageio.get_reader(out / r["outputs"][0]) as reader:  # the file has what the record says
        assert sum(1 for _ in reader) == 17


def test_failed_job_gives_exit_code_1(tmp_path, monkeypatch):
    import sagevideo.pipelines.runner as runner_module

    real = runner_module.run_job
    monkeypatch.setattr(
        runner_module,
        "run_job",
        lambda pipe, job, **kw: (
            (_ for _ in ()).throw(RuntimeError("boom")) if job.prompt == "bad" else real(pipe, job, **kw)
        ),
    )
    result = invoke("--out", tmp_path, "-p", "bad", "-p", "good", "--no-progress")
    assert result.exit_code == 1
    assert "failed: RuntimeError: boom" in result.stderr
    assert "1 done, 0 skipped, 1 failed" in result.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (["missing.txt"], "prompts file missing.txt does not exist"),
        (["--model", "/no/such/folder"], "--model /no/such/folder: no such folder"),
        (["--frames", "8"], "--frames 8: 8 is not 1 + a multiple of 4"),  # the option, not "job 1: frames:"
        (["--backend", "triton", "--device", "cpu"], "--backend triton cannot run"),
        (["--job-timeout", "0"], "--job-timeout 0.0: give seconds > 0"),
    ],
)
def test_bad_input_exits_2_with_one_clear_line(tmp_path, monkeypatch, args, message):
    import sagevideo.pipelines.loading as loading

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(loading, "load_pipeline", lambda *a, **k: pytest.fail("model loaded"))
    result = invoke(*args, "--out", tmp_path / "out")
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("sagevideo generate: error: ") and message in lines[0]


def test_out_is_a_file(tmp_path):
    blocker = tmp_path / "f"
    blocker.write_text("x")
    result = invoke("--out", blocker / "sub")
    assert result.exit_code == 2 and "cannot write there" in result.stderr


def test_help_and_missing_out():
    assert "--out" in runner.invoke(app, ["generate", "--help"]).stdout
    result = invoke()
    assert result.exit_code == 2 and "--out" in result.output


def test_model_that_cannot_load_exits_1(tmp_path, monkeypatch):
    import sagevideo.pipelines.loading as loading

    def broken(*args, **kwargs):
        raise OSError("header too large")  # e.g. a corrupt safetensors file

    monkeypatch.setattr(loading, "load_pipeline", broken)
    result = invoke("--out", tmp_path, "--no-progress")
    assert result.exit_code == 1
    assert "error: could not load model tiny: OSError: header too large" in result.stderr
    assert not (tmp_path / "manifest.jsonl").exists()


def test_a_mistyped_manifest_line_is_said_once_and_the_batch_resumes(tmp_path):
    out = tmp_path / "out"
    first = invoke("--out", out, "-p", "a fox", "--no-progress")
    assert first.exit_code == 0, first.output
    manifest = out / "manifest.jsonl"
    with manifest.open("a") as f:  # valid JSON, wrong types: a hand edit or another tool's line
        f.write('{"job_id": "0123", "status": "done", "outputs": 5}\n{"job_id": "b", "sta')
    again = invoke("--out", out, "-p", "a fox", "--no-progress")
    assert again.exit_code == 0, again.output
    assert "0 done, 1 skipped" in again.stdout
    said = [line for line in again.stderr.splitlines() if "not a usable record" in line]
    assert len(said) == 2 and said[0].startswith("sagevideo: manifest.jsonl line 2 is not a usable record (field "
                                                 "outputs: Input should be a valid list (got 5))")
    assert "Traceback" not in again.output and "Warning" not in again.output
    third = invoke("--out", out, "-p", "a fox", "--no-progress")
    assert third.exit_code == 0 and "not a usable record" not in third.stderr


def test_cli_refuses_a_bad_file_with_exit_2(tmp_path, monkeypatch):
    import sagevideo.pipelines.loading as loading

    monkeypatch.setattr(loading, "load_pipeline", lambda *a, **k: pytest.fail("model loaded"))
    path = write(tmp_path, "s.yaml", "jobs:\n  - prompt: a\n    atention: full\n")
    result = CliRunner().invoke(app, ["generate", str(path), "--out", str(tmp_path / "out")])
    assert result.exit_code == 2
    assert result.stderr.strip() == (
        f"sagevideo generate: error: {path} line 3 (job 1): atention: unknown field; remove it or check "
        "its spelling (did you mean 'attention'?)"
    )


def test_cli_option_error_names_the_option(tmp_path, no_model_load):
    result = CliRunner().invoke(app, ["generate", "-p", "x", "--steps", "0", "--out", str(tmp_path / "out")])
    assert result.exit_code == 2
    assert result.stderr.strip() == "sagevideo generate: error: --steps 0: Input should be greater than or equal to 1"


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--gpus-per-job", "4"], "--gpus-per-job 4: the 2 attention heads of tiny are not divisible by 4 "
         "(each rank attends over whole heads); use one of [1, 2]"),
        (["--gpus-per-job", "2", "--height", "48", "--width", "48"], "job 1, job 2: --gpus-per-job 2: 253 tokens "
         "(226 text + 27 video) are not divisible by 2; change frames/size or the degree (frames 9, 48x48 px)"),
        (["--gpus-per-job", "0"], "--gpus-per-job 0: give a whole number >= 1"),
    ],
)
def test_cli_refuses_a_degree_before_loading(tmp_path, no_model_load, extra, message):
    args = ["generate", "--out", str(tmp_path), "--device", "cpu", "-p", "a cat", "-p", "a dog", *extra]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert f"sagevideo generate: error: {message}" in result.stderr
    assert not (tmp_path / "manifest.jsonl").exists()


def test_cli_option_and_job_file_recipe_that_disagree_exit_2_naming_both(tmp_path, no_model_load):
    path = write(tmp_path, "s.toml", "[recipe]\ncache = \"first-block\"\n\n[[jobs]]\nprompt = \"a\"\n")
    result = CliRunner().invoke(app, ["generate", str(path), "--out", str(tmp_path / "out"), "--cache", "taylorseer"])
    assert result.exit_code == 2, result.output
    assert result.stderr.strip() == (
        f"sagevideo generate: error: {path} line 2 (recipe): cache: the job file's recipe sets 'first-block' and "
        "--cache taylorseer is given too; set it in one place (the file's recipe applies where the option is left out)"
    )


# The command in a child process whose loader refuses to run (exit 3): checks of the process's
# environment (HOME, torch's cache variables) must refuse before anything loads.
NO_LOAD = (
    "import os, sys\n"
    "import sagevideo.pipelines.loading as loading\n"
    "def refuse(*args, **kwargs):\n"
    "    print('a model was loaded', file=sys.stderr)\n"
    "    os._exit(3)\n"
    "loading.load_pipeline = refuse\n"
    "from sagevideo.cli.app import app\n"
    "app(sys.argv[1:], prog_name='sagevideo')\n"
)


def run_child(args, env_changes, *, prefix=()):
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items()
           if k not in ("SAGEVIDEO_COMPILE_CACHE", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")}
    env.update(PYTHONPATH=os.pathsep.join([str(root), env.get("PYTHONPATH", "")]), HF_HUB_OFFLINE="1", **env_changes)
    command = [*prefix, sys.executable, "-c", NO_LOAD, "generate", *map(str, args)]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)


def refused_in_one_line(done):
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and "a model was loaded" not in done.stderr
    (line,) = [line for line in done.stderr.splitlines() if "error:" in line]
    return line


@pytest.mark.slow
def test_a_read_only_home_refuses_compile_before_loading(tmp_path):
    """The default compile cache lives under HOME: read-only there, every job used to load the
    model and then fail at its first compiled step. As root a read-only bind mount in a private
    mount namespace stands for it (permissions do not stop root)."""
    import os
    import shutil

    home = tmp_path / "home"
    home.mkdir()
    prefix: tuple[str, ...] = ()
    if os.geteuid() == 0:
        if shutil.which("unshare") is None:
            pytest.skip("needs unshare(1) to make a read-only HOME as root")
        remount = 'mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" || exit 97; exec "$@"'
        prefix = ("unshare", "-m", "--propagation", "private", "sh", "-c", remount, str(home))
    else:
        home.chmod(0o555)
    done = run_child(["-p", "a fox", "--out", tmp_path / "out", "--steps", "1", "--no-progress", "--compile",
                      "regional", "--compile-backend", "eager"], {"HOME": str(home)}, prefix=prefix)
    if done.returncode == 97:
        pytest.skip("cannot mount here")
    line = refused_in_one_line(done)
    assert line.startswith(f"sagevideo generate: error: --compile regional: the compile cache {home}/.cache/")
    assert ("Read-only file system" in line or "Permission denied" in line) and \
        line.endswith("set SAGEVIDEO_COMPILE_CACHE to a writable folder")


@pytest.mark.slow
def test_an_inductor_cache_variable_naming_a_file_is_one_line_not_a_traceback(tmp_path):
    """torch creates TORCHINDUCTOR_CACHE_DIR when torch._dynamo is first imported; a file there made
    every run (with or without --compile) end in a FileExistsError traceback while planning."""
    blocker = tmp_path / "blocker"
    blocker.write_text("x")
    done = run_child(["-p", "a fox", "--out", tmp_path / "out", "--steps", "1", "--no-progress"],
                     {"TORCHINDUCTOR_CACHE_DIR": str(blocker)})
    line = refused_in_one_line(done)
    assert line == (f"sagevideo generate: error: the compile cache {blocker} (TORCHINDUCTOR_CACHE_DIR={blocker}) "
                    "cannot be written (it is a file, not a folder); set TORCHINDUCTOR_CACHE_DIR to a writable "
                    "folder, or unset it")


def test_a_yaml_job_file_named_txt_exits_2_and_makes_no_video(tmp_path):
    shots = write(tmp_path, "shots.txt", "defaults: {steps: 2}\njobs:\n  - prompt: a red fox\n")
    result = invoke(shots, "--out", tmp_path / "out", "--no-progress")
    assert result.exit_code == 2
    assert result.stderr.startswith(f"sagevideo generate: error: {shots} line 1: looks like a YAML/TOML job "
                                    "file ('defaults: {steps: 2}' (and 1 more such line)) but is read as one prompt")
    assert "name it .yaml" in result.stderr and not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--sparse", "dense:0.2"], "--sparse dense:0.2: 'dense:0.2': unknown method 'dense'; give METHOD:DENSITY with "
         "METHOD dynamic or static and DENSITY in (0, 1], e.g. dynamic:0.15 (dynamic:0.15:reuse2 selects every other "
         "step), or off"),
        (["--sparse", "dynamic:1.5"], "--sparse dynamic:1.5: 'dynamic:1.5': density 1.5 is outside (0, 1]"),
        (["--sparse", "static:0.2", "--attention", "full"], "--sparse static:0.2: static:0.2 with attention full: full "
         "precision runs stock SDPA, which is never block-sparse; use sparse off or attention sage"),
    ],
)
def test_cli_refuses_a_sparse_setting_that_cannot_run_before_loading(tmp_path, no_model_load, extra, message):
    args = ["generate", "--out", str(tmp_path / "out"), "--device", "cpu", "-p", "a cat", *extra]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert f"sagevideo generate: error: {message}" in result.stderr
    assert not (tmp_path / "out" / "manifest.jsonl").exists()


def test_a_job_file_sets_sparse_per_job_and_a_plan_beside_it_is_refused(tmp_path, no_model_load):
    from sagevideo.pipelines.plans import AttentionPlan

    plan = AttentionPlan.uniform("int8-fp16").save(tmp_path / "plan.json")
    path = write(tmp_path, "jobs.yaml", f"""\
        defaults:
          sparse: static:0.25
        jobs:
          - prompt: a cat
          - prompt: a dog
            sparse: off
          - prompt: a fox
            plan: {plan}
        """)
    result = CliRunner().invoke(app, ["generate", str(path), "--out", str(tmp_path / "out"), "--device", "cpu"])
    assert result.exit_code == 2, result.output
    assert result.stderr.strip() == (  # job 3 only: the others run (job 2 dense), once the plan conflict is solved
        f"sagevideo generate: error: {path} line 2 (defaults): sparse: static:0.25 with plan {plan}: a plan file's own "
        "settings rule; put the sparse setting in the plan (\"sparse\": {\"method\": ..., \"density\": ...} on its "
        "quantized choices) or leave sparse off")
