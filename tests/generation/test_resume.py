"""What a re-run renders again, and what it does not: a model changed in place makes its renders
stale (rendered again, and the summary says so); the same model at another path, PNG frames added
to a finished batch, and the same video under two names are made without rendering."""

import json
import os
import shutil

import imageio.v2 as imageio
import imageio.v3 as iio
import numpy as np
import pytest
from typer.testing import CliRunner

from sagevideo.cli.app import app
from sagevideo.generation.generate import pending_jobs, plan_batch, run_batch
from tests.helpers.weights import rewrite_in_place

FAST = {"steps": 1, "attention": "full", "progress": False}
FAST_CLI = ["--steps", "1", "--attention", "full", "--no-progress"]


def manifest_lines(out):
    return [json.loads(line) for line in (out / "manifest.jsonl").read_text().splitlines()]


def files(out):
    """name -> (inode, mtime_ns) of every mp4 and PNG under `out`."""
    return {p.relative_to(out).as_posix(): (p.stat().st_ino, p.stat().st_mtime_ns)
            for p in sorted(out.rglob("*")) if p.suffix in (".mp4", ".png")}


@pytest.fixture
def renders(monkeypatch):
    """The prompts of the jobs rendered (the runner called), in order."""
    import sagevideo.pipelines.runner as runner

    done, real = [], runner.run_job
    monkeypatch.setattr(runner, "run_job", lambda pipe, job, **kw: done.append(job.prompt) or real(pipe, job, **kw))
    return done


@pytest.fixture
def folder(tmp_path, tiny_pipe):
    """The tiny model saved as a diffusers folder, loaded the way real folders are."""
    path = tmp_path / "models" / "tiny"
    tiny_pipe.save_pretrained(path, safe_serialization=True)
    return path


def no_load(monkeypatch):
    import sagevideo.pipelines.loading as loading

    monkeypatch.setattr(loading, "load_pipeline", lambda *a, **k: pytest.fail("loaded a model"))


JOBS = [{"prompt": "a cat"}, {"prompt": "a dog", "output": "dog"}]


@pytest.mark.slow  # two model loads, four renders
def test_weights_rewritten_in_place_make_the_finished_renders_stale(tmp_path, folder, renders):
    """Same shapes, other values (a fine-tune written over the files): before, the fingerprint (the
    configs and the weights' sizes) did not change and both old videos counted as done."""
    out = tmp_path / "out"
    first = run_batch(plan_batch(JOBS, out=out, model=str(folder), **FAST), progress=False)
    old_cat, old_dog = first.records
    rewrite_in_place(folder / "transformer" / "diffusion_pytorch_model.safetensors")

    plan = plan_batch(JOBS, out=out, model=str(folder), **FAST)
    lines = []
    report = run_batch(plan, progress=False, echo=lines.append)
    assert (report.done, report.skipped) == (2, 0) and renders == ["a cat", "a dog"] * 2
    new = plan.source.fingerprint
    why = (f"2 earlier render(s) stale, rendered again: the model changed since (fingerprint "
           f"{old_cat['model_fingerprint']}, now {new}: its weights or configs differ)")
    assert why in report.summary_line() and any(why in line for line in lines)
    # Nothing is lost: the automatic name changed with the model, the fixed one kept the old render aside.
    assert (out / old_cat["outputs"][0]).is_file() and report.records[0]["outputs"][0] != old_cat["outputs"][0]
    assert (out / f"dog.was-{old_dog['job_id'][:10]}.mp4").is_file() and (out / "dog.mp4").is_file()
    again = run_batch(plan_batch(JOBS, out=out, model=str(folder), **FAST), progress=False)
    assert (again.done, again.skipped, again.stale) == (0, 2, [])


def test_a_render_recorded_before_fingerprints_covered_weights_renders_again_and_says_why(tmp_path, folder):
    """A record of the scheme before (the model's path in the id, a fingerprint of configs and sizes,
    no render key) cannot tell a changed model from the same one: its job renders again, the summary
    says why, and the earlier video is kept aside under its fixed name."""
    out = tmp_path / "out"
    plan = plan_batch([{"prompt": "a cat", "output": "cat"}], out=out, model=str(folder), **FAST)
    run_batch(plan, progress=False)
    (record,) = manifest_lines(out)
    legacy_id = plan.jobs[0].identity.legacy_id(str(folder), "5a5a5a5a5a5a")
    old = {**record, "job_id": legacy_id, "model_fingerprint": "5a5a5a5a5a5a", "render_key": None, "reused": None}
    (out / "manifest.jsonl").write_text(json.dumps(old) + "\n")
    report = run_batch(plan, progress=False)
    assert (report.done, report.skipped) == (1, 0)
    assert ("1 earlier render(s) rendered again: recorded by a sagevideo whose model fingerprint did not cover "
            "weight contents, so a changed model could not be ruled out") in report.summary_line()
    assert (out / f"cat.was-{legacy_id[:10]}.mp4").is_file()


def test_the_same_model_at_another_path_resumes_with_nothing_rendered(tmp_path, folder, monkeypatch):
    """Before, the folder's path was part of every job id: a moved or copied model re-rendered all."""
    out = tmp_path / "out"
    first = run_batch(plan_batch(JOBS, out=out, model=str(folder), **FAST), progress=False)
    before = files(out)
    moved = shutil.copytree(folder, tmp_path / "elsewhere" / "CogVideoX-tiny")
    no_load(monkeypatch)
    report = run_batch(plan_batch(JOBS, out=out, model=str(moved), **FAST), progress=False)
    assert (report.done, report.skipped, report.failed) == (0, 2, 0)
    assert report.records == first.records and files(out) == before


def test_adding_frames_png_to_a_finished_batch_writes_the_frames_from_the_mp4(tmp_path, monkeypatch):
    """`--frames-png` on a finished batch: before, frames_png was part of the job id, so every job
    rendered again under a new name; now the frames are decoded from each finished mp4, which stays
    as it is (same inode, same mtime), and no model loads."""
    jobs = tmp_path / "shots.yaml"
    jobs.write_text(json.dumps({"jobs": JOBS}))
    out = tmp_path / "out"
    assert CliRunner().invoke(app, ["generate", str(jobs), "--out", str(out), *FAST_CLI]).exit_code == 0
    mp4s = files(out)
    no_load(monkeypatch)
    result = CliRunner().invoke(app, ["generate", str(jobs), "--out", str(out), "--frames-png", *FAST_CLI])
    assert result.exit_code == 0, result.output
    assert "2 done, 0 skipped, 0 failed" in result.stdout
    assert "2 of them not rendered again: 2 with PNG frames decoded from the finished mp4" in result.stdout
    now = files(out)
    assert {name: now[name] for name in mp4s} == mp4s and len(now) == 2 + 2 * 9
    cat, dog = manifest_lines(out)[2:]
    assert dog["outputs"] == ["dog.mp4", "dog_frames"] and cat["job_id"] == manifest_lines(out)[0]["job_id"]
    assert cat["reused"] == {"job_id": cat["job_id"], "video": "kept", "frames": "decoded"}
    with imageio.get_reader(out / "dog.mp4", format="FFMPEG") as reader:
        frames = np.stack([frame for frame in reader])  # list(reader) raises MemoryError (its length is inf)
    pngs = np.stack([iio.imread(p) for p in sorted((out / "dog_frames").glob("frame_*.png"))])
    assert np.array_equal(pngs, frames)  # exactly what the mp4 holds
    again = CliRunner().invoke(app, ["generate", str(jobs), "--out", str(out), "--frames-png", *FAST_CLI])
    assert "0 done, 2 skipped" in again.stdout and files(out) == now


def test_the_same_video_under_two_names_renders_once(tmp_path, renders, monkeypatch):
    """Same prompt, seed and settings, two output names: before, two renders of one video. Now
    the first renders and the second name is a hard link to its mp4 (frames decoded from it), the
    manifest says so; a third name added later takes a link too, with no model loaded."""
    out = tmp_path / "out"
    jobs = [{"prompt": "a cat", "output": "sh010"}, {"prompt": "a cat", "output": "sh020", "frames_png": True}]
    plan = plan_batch(jobs, out=out, **FAST)
    assert [pj.output for _, pj in pending_jobs(plan)] == ["sh010.mp4"]  # what every torchrun rank renders
    assert any(note.startswith("1 job(s) make the same video as another under another name") for note in plan.notes)
    report = run_batch(plan, progress=False)
    assert renders == ["a cat"] and report.done == 2
    first, second = manifest_lines(out)
    assert second["reused"] == {"job_id": first["job_id"], "video": "hardlink", "frames": "decoded"}
    assert second["render_key"] == first["render_key"] and second["job_id"] != first["job_id"]
    assert second["outputs"] == ["sh020.mp4", "sh020_frames"] and len(list((out / "sh020_frames").iterdir())) == 9
    assert (out / "sh020.mp4").stat().st_ino == (out / "sh010.mp4").stat().st_ino
    summary = report.summary_line()
    assert "1 of them not rendered again: 1 made from another job's identical video (1 hard link)" in summary

    no_load(monkeypatch)
    more = run_batch(plan_batch([*jobs, {"prompt": "a cat", "output": "sh030", "frames_png": True}], out=out, **FAST),
                     progress=False)
    assert (more.done, more.skipped) == (1, 2)
    third = manifest_lines(out)[-1]
    assert third["reused"] == {"job_id": second["job_id"], "video": "hardlink", "frames": "hardlink"}
    assert os.path.samefile(out / "sh030_frames" / "frame_00000.png", out / "sh020_frames" / "frame_00000.png")
    assert os.path.samefile(out / "sh030.mp4", out / "sh010.mp4")


def test_a_job_made_from_a_failed_render_fails_with_it(tmp_path, monkeypatch):
    import sagevideo.pipelines.runner as runner

    def fail(pipe, job, **kwargs):
        raise RuntimeError("simulated failure")

    monkeypatch.setattr(runner, "run_job", fail)
    out = tmp_path / "out"
    report = run_batch(plan_batch([{"prompt": "a cat", "output": "a"}, {"prompt": "a cat", "output": "b"}],
                                  out=out, **FAST), progress=False)
    assert report.failed == 2
    first, second = manifest_lines(out)
    assert second["status"] == "failed" and second["error"] == (
        "not rendered: job 1 makes the same video and failed (RuntimeError: simulated failure)")
    assert sorted(os.listdir(out)) == ["manifest.jsonl"]
