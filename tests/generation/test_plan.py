"""Planning a batch (`generation/plan.py`): jobs from prompts, dicts, specs and files, defaults,
and every check that refuses a batch before anything loads (bad input, output names, plans,
--pv auto, --gpus-per-job against the model, the jobs and this machine)."""

from __future__ import annotations

import json
import textwrap

import pytest
from typer.testing import CliRunner

import sagevideo
from sagevideo.cli.app import app
from sagevideo.errors import InputError
from sagevideo.generation.generate import plan_batch
from sagevideo.jobs.specs import JobSpec


def plan_file(tmp_path, **fields):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({"version": 1, "default": {"mode": "int8-fp16"}, **fields}))
    return path


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def test_job_file_lines_and_python_api(tmp_path, no_model_load):
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text("jobs:\n  - prompt: fine\n  - prompt: odd size\n    frames: 9\n    resolution: 48x48\n")
    refused = r"jobs.yaml line 4 \(job 2\): --gpus-per-job 2: 253 tokens \(226 text \+ 27 video\)"
    with pytest.raises(InputError, match=refused):
        sagevideo.generate(jobs, out=tmp_path / "out", device="cpu", gpus_per_job=2, progress=False)


def test_more_ranks_than_gpus_here(tmp_path, no_model_load, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))  # --pv auto asks
    shows = r"--gpus-per-job 2: this machine shows 1 GPU\(s\); give at most 1, or --address"
    with pytest.raises(InputError, match=shows):
        sagevideo.generate(["a cat"], out=tmp_path, device="cuda", attention="full", gpus_per_job=2, progress=False)


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


def test_explicit_output_equal_to_another_jobs_automatic_name_is_refused_before_loading(tmp_path, monkeypatch):
    import sagevideo.pipelines.loading as loading

    (auto,) = plan_batch(["a cat"], out=tmp_path / "probe").jobs  # the automatic name of that job
    shots = tmp_path / "shots.yaml"
    stem = auto.output.removesuffix(".mp4")
    shots.write_text(f"jobs:\n  - prompt: a cat\n  - prompt: a dog\n    output: {stem}\n")
    monkeypatch.setattr(loading, "load_pipeline", lambda *a, **k: pytest.fail("model loaded"))
    result = CliRunner().invoke(app, ["generate", str(shots), "--out", str(tmp_path / "out")])
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.strip().splitlines()
    assert line == (
        f"sagevideo generate: error: {shots} line 4 (job 2): output: '{stem}' is the automatic output name of "
        f"{shots} line 2 (job 1) ({auto.output}); give this job another output name"
    )
    assert not (tmp_path / "out").exists()


def test_invalid_plan_is_refused_before_loading(tmp_path):
    (tmp_path / "p.json").write_text(json.dumps({"version": 1, "default": {"mode": "int4"}}))
    path = write(tmp_path, "s.yaml", "jobs:\n  - prompt: a cat\n    plan: p.json\n")
    with pytest.raises(InputError, match=r"s.yaml line 3 \(job 1\): plan: .*default.mode: Input should be"):
        plan_batch(job_file=path, out=tmp_path / "o")


def test_a_plan_naming_a_layer_the_model_lacks_is_refused_before_loading(tmp_path, no_model_load):
    plan = plan_file(tmp_path, overrides=[{"layers": ["transformer_blocks.7.attn1"], "mode": "full"}])
    path = write(tmp_path, "s.yaml", f"jobs:\n  - prompt: a\n    plan: {plan}\n")
    with pytest.raises(InputError, match=r"s.yaml line 3 \(job 1\): plan: .*plan.json: plan names 1 layer\(s\) "
                       r"this transformer does not have, e.g. \['transformer_blocks.7.attn1'\]"):
        plan_batch(job_file=path, out=tmp_path / "out")
    with pytest.raises(InputError, match=rf"^--plan {plan}: plan names 1 layer"):  # the option, by its name
        plan_batch("a", plan=plan, out=tmp_path / "out")


def test_a_step_range_no_job_reaches_is_refused_and_a_step_count_mismatch_noted(tmp_path, no_model_load):
    plan = plan_file(tmp_path, overrides=[{"steps": [5, None], "mode": "full"}])
    path = write(tmp_path, "s.yaml", f"jobs:\n  - prompt: a\n    plan: {plan}\n  - prompt: b\n    plan: {plan}\n"
                 "    steps: 8\n")
    with pytest.raises(InputError) as err:  # 2 steps (the tiny default): [5, null] would never apply
        plan_batch(job_file=path, out=tmp_path / "out")
    (line,) = str(err.value).splitlines()
    assert line.startswith(f"{path} line 3 (job 1): plan: {plan}: plan overrides[0] starts at step 5 but the run "
                           "has 2 steps (0..1), so it would never apply")

    calibrated = plan_file(tmp_path, num_steps=50, layers=["transformer_blocks.0.attn1", "transformer_blocks.1.attn1"])
    batch = plan_batch("a", plan=calibrated, out=tmp_path / "out")
    assert any(n.startswith("plan plan.json was made for 50 steps but runs on jobs of 2 step(s)") for n in batch.notes)
