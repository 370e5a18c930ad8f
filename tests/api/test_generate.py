"""sagevideo.generate end to end on the tiny model: files, manifest, resume, failures, input checks."""

import json
import os
import re
import socket

import imageio.v2 as imageio
import pytest

import sagevideo
from sagevideo.generation.generate import plan_batch
from sagevideo.jobs.specs import DEFAULT_PROMPTS, InputError, JobSpec

RECORD_FIELDS = set(
    "schema job_id status error prompt negative_prompt seed frames height width steps guidance name model "
    "model_fingerprint attention pv backend plan plan_sha256 device dtype fps backends timings outputs "
    "attempts retries worker started created sagevideo_version".split()
)


def count_frames(path):
    with imageio.get_reader(path) as reader:  # iterate: list(reader) raises MemoryError
        shapes = [frame.shape for frame in reader]
    return len(shapes), shapes[0]


def manifest_lines(out):
    return [json.loads(line) for line in (out / "manifest.jsonl").read_text().splitlines()]


@pytest.fixture
def no_model_load(monkeypatch):
    """Fail the test if anything tries to load a model."""
    import sagevideo.pipelines.loading as loading

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(loading, "load_pipeline", refuse)


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


def test_default_batch_end_to_end(tmp_path):
    out = tmp_path / "out"
    records = sagevideo.generate(out=out, progress=False)
    assert [r["prompt"] for r in records] == list(DEFAULT_PROMPTS)
    assert manifest_lines(out) == records
    for r in records:
        assert set(r) == RECORD_FIELDS
        assert r["status"] == "done" and r["error"] is None
        assert (r["frames"], r["height"], r["width"], r["steps"], r["model"]) == (9, 64, 64, 2, "tiny")
        # CPU + backend auto runs the emulation of the quantized kernels, not the SDPA fallback
        assert (r["attention"], r["backend"], r["pv"], r["device"]) == ("sage", "reference", "fp16", "cpu")
        assert r["backends"] == {"counts": {"reference/fp16": 4}, "fallbacks": {}}  # 2 layers x 2 steps
        assert all(isinstance(r["timings"][k], float) for k in ("load_s", "denoise_s", "decode_s", "write_s"))
        assert r["sagevideo_version"] == sagevideo.__version__
        assert (r["attempts"], r["retries"], r["plan"], r["plan_sha256"]) == (1, [], None, None)
        assert r["started"] <= r["created"] and r["started"].endswith("+00:00")
        assert r["worker"] == {"host": socket.gethostname(), "pid": os.getpid(), "node": None}
        (name,) = r["outputs"]
        assert re.fullmatch(r"[a-z0-9-]+-[0-9a-f]{10}\.mp4", name) and name.endswith(
            r["job_id"][:10] + ".mp4"
        )
        assert count_frames(out / name) == (9, (64, 64, 3))
    assert sorted(os.listdir(out)) == sorted(["manifest.jsonl", *(r["outputs"][0] for r in records)])


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


def test_names_are_sanitized_and_stay_inside_out(tmp_path):
    out = tmp_path / "out"
    records = sagevideo.generate(
        [{"prompt": "../../../etc/passwd"}, {"prompt": "x", "name": "/abs/../.hidden"}, "ÄÖÜ 日本 ?*:|"],
        out=out,
        progress=False,
    )
    names = [r["outputs"][0] for r in records]
    assert (
        names[0].startswith("etc-passwd-")
        and names[1].startswith("abs-hidden-")
        and names[2].startswith("aou-")
    )
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == sorted(["manifest.jsonl", *names])


def test_job_ids_are_stable_and_setting_sensitive(tmp_path):
    def ids(**kw):
        return [j.job_id for j in plan_batch(["a cat"], out=tmp_path, **kw).jobs]

    assert ids() == ids() == ids(frames=9, height=64)  # model defaults resolve before hashing
    variants = [ids(seed=1), ids(pv="fp8"), ids(attention="full"), ids(steps=3), ids(negative_prompt="blur")]
    assert len({i[0] for i in variants} | set(ids())) == len(variants) + 1


def test_jobs_from_dicts_and_specs_with_keyword_defaults(tmp_path):
    plan = plan_batch(
        ["a", {"prompt": "b", "seed": 7}, JobSpec(prompt="c", frames=25), "a"],
        out=tmp_path,
        seed=3,
        frames=17,
    )
    assert [(j.job.prompt, j.job.seed, j.job.frames) for j in plan.jobs] == [
        ("a", 3, 17),
        ("b", 7, 17),
        ("c", 0, 25),
    ]
    assert any("1 duplicate job" in note for note in plan.notes)
    assert any("quantization emulation" in note for note in plan.notes)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(prompts_or_jobs=["a", "  "]), r"job 2: prompt: prompt is empty"),
        (dict(prompts_or_jobs=[]), r"no prompts"),
        (dict(prompts_or_jobs=[{"prompt": "a", "sede": 1}]), r"job 1: sede: unknown field"),
        (
            dict(seed=-1),
            r"^--seed -1: Input should be greater than or equal to 0$",  # once, by the option's name
        ),
        (dict(frames=10), r"^--frames 10: 10 is not 1 \+ a multiple of 4"),
        (dict(guidance=float("nan")), r"^--guidance nan: Input should be a finite number$"),  # not "<= 100"
        (dict(attention="fast"), r"^--attention fast: Input should be 'sage' or 'full'"),
        (dict(model="/no/such/model"), r"--model /no/such/model: no such folder"),
        (dict(device="cuda"), r"--device cuda: .* sees no CUDA GPU"),
        (dict(backend="triton", device="cpu"), r"--backend triton cannot run"),
        (dict(prompts_file="/no/such/prompts.txt"), r"prompts file /no/such/prompts.txt does not exist"),
    ],
)
def test_bad_input_is_reported_before_loading(tmp_path, no_model_load, kwargs, message):
    if kwargs.get("device") == "cuda":
        import torch

        if torch.cuda.is_available():
            pytest.skip("a GPU is present")
    out = tmp_path / "out"
    with pytest.raises(InputError, match=message):
        sagevideo.generate(out=out, progress=False, **kwargs)
    assert not (out / "manifest.jsonl").exists()


def test_prompts_file_problems(tmp_path, no_model_load):
    empty = tmp_path / "empty.txt"
    empty.write_text("# only a comment\n\n")
    with pytest.raises(InputError, match="has no prompts"):
        plan_batch(prompts_file=empty, out=tmp_path / "out")
    binary = tmp_path / "bin.txt"
    binary.write_bytes(b"a cat\n\xff\xfe\n")
    with pytest.raises(InputError, match="is not UTF-8 text"):
        plan_batch(prompts_file=binary, out=tmp_path / "out")
    good = tmp_path / "p.txt"
    good.write_text("# header\na cat\n\n  a dog  \n")
    assert [j.job.prompt for j in plan_batch(prompts_file=good, out=tmp_path / "out").jobs] == [
        "a cat",
        "a dog",
    ]


def test_unwritable_out(tmp_path, no_model_load):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(InputError, match="is a file, not a folder"):
        plan_batch(["a"], out=blocker)
    with pytest.raises(InputError, match="cannot write there"):
        plan_batch(["a"], out=blocker / "sub")


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


@pytest.mark.parametrize("bad", [0, -5, float("inf"), "10", True])
def test_bad_job_timeout_is_refused(tmp_path, no_model_load, bad):
    with pytest.raises(InputError, match=r"--job-timeout .*: give seconds > 0"):
        sagevideo.generate("a cat", out=tmp_path, job_timeout=bad, progress=False)


@pytest.mark.parametrize(
    "pv, device, capability, expected",
    [("auto", "cpu", None, "fp16"), ("auto", "cuda", (9, 0), "fp8"), ("auto", "cuda", (8, 9), "fp8"),
     ("auto", "cuda", (8, 0), "fp16"), ("fp16", "cuda", (9, 0), "fp16"), ("fp8", "cpu", None, "fp8")],
)
def test_pv_auto_follows_the_gpu_like_the_default_plan(monkeypatch, pv, device, capability, expected):
    import torch

    from sagevideo.generation.plan import resolve_pv

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: capability or pytest.fail("asked a CPU"))
    assert resolve_pv(pv, device) == expected


def test_default_pv_on_cpu_is_fp16_and_recorded(tmp_path, no_model_load):
    plan = plan_batch(["a cat"], out=tmp_path)
    assert plan.settings.pv == "fp16" and plan.jobs[0].job.pv == "fp16" and plan.jobs[0].backend == "reference"


def test_a_misspelt_sm90_kernel_choice_is_refused_before_loading(tmp_path, no_model_load, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setenv("SAGEVIDEO_SM90_KERNEL", "glun")
    with pytest.raises(InputError, match=r"SAGEVIDEO_SM90_KERNEL='glun': use one of \('auto', 'triton', 'gluon'\)"):
        plan_batch(["a cat"], out=tmp_path, device="cuda")
    monkeypatch.setenv("SAGEVIDEO_SM90_KERNEL", "gluon")  # spelt right: planned, the kernel named
    plan = plan_batch(["a cat"], out=tmp_path, device="cuda", pv="fp8")
    assert plan.jobs[0].backend == "auto"
