"""An `ab` run's folders: claimed (locked, checked, marked) before its first arm runs; `generate`
refuses them as --out. Planned, not rendered: the first arm's run stops each test."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

import sagevideo.generation.generate as generate
from sagevideo.cli.app import app
from sagevideo.errors import InputError
from sagevideo.experiments.ab import ab
from sagevideo.outputs.folders import FolderLock


class FirstArmRan(Exception):
    pass


@pytest.fixture
def first_arm(monkeypatch):
    """run_batch replaced: records the arm folders it was given, calls `during(batch)` for the first
    (while ab holds its folders), then stops the run."""
    state = {"ran": [], "during": None}

    def run(batch, **kwargs):
        state["ran"].append(batch.out.name)
        during, state["during"] = state["during"], None  # once: a generate it starts runs no video either
        if during is not None:
            during(batch)
        raise FirstArmRan

    monkeypatch.setattr(generate, "run_batch", run)
    return state


@pytest.fixture
def jobs(tmp_path):
    path = tmp_path / "jobs.txt"
    path.write_text("a red fox\n", encoding="utf-8")
    return path


def generate_into(out):
    return CliRunner().invoke(app, ["generate", "--out", str(out), "--prompt", "a cat", "--no-progress"])


def test_generate_into_an_arm_ab_has_not_reached_is_refused_while_ab_runs_and_after(tmp_path, jobs, first_arm):
    out = tmp_path / "ab"
    results = {}
    first_arm["during"] = lambda batch: results.update(full=generate_into(out / "full"), root=generate_into(out))
    with pytest.raises(FirstArmRan):
        ab(jobs, out=out, device="cpu", progress=False)
    assert first_arm["ran"] == ["quantized"]
    results["full-repeat"] = generate_into(out / "full-repeat")  # ab stopped: its folders are still its own
    for arm in ("full", "full-repeat"):
        assert results[arm].exit_code == 2
        (line,) = results[arm].stderr.splitlines()
        assert line.startswith(f"sagevideo generate: error: --out {out / arm}: is the '{arm}' arm of the `sagevideo "
                               f"ab` run in {out}, which renders there")
        assert line.endswith("give another --out, or re-run that ab command to resume it")
    assert results["root"].exit_code == 2 and "holds a `sagevideo ab` run" in results["root"].stderr
    assert sorted(p.name for p in (out / "full").iterdir()) == [".sagevideo-ab.json"]  # nothing was written there
    with pytest.raises(InputError, match=r"full' arm of the `sagevideo ab` run"):
        generate.plan_batch("a cat", out=out / "full")  # the Python API too

    with pytest.raises(FirstArmRan):  # ab itself resumes into its marked folders
        ab(jobs, out=out, device="cpu", progress=False)
    assert first_arm["ran"] == ["quantized", "quantized"]


def test_ab_refuses_a_locked_arm_before_its_first_arm_runs(tmp_path, jobs, first_arm):
    out = tmp_path / "ab"
    (out / "full-repeat").mkdir(parents=True)
    holder = FolderLock(out / "full-repeat", InputError)
    holder.acquire()  # another run writes into the third arm
    try:
        result = CliRunner().invoke(app, ["ab", str(jobs), "--out", str(out), "--device", "cpu", "--no-progress"])
    finally:
        holder.release()
    assert result.exit_code == 2 and first_arm["ran"] == []
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"sagevideo ab: error: --out {out / 'full-repeat'}: another sagevideo run is writing there")
    assert not (out / "quantized" / ".sagevideo-ab.json").exists()  # nothing claimed
    with FolderLock(out / "quantized", InputError):  # every lock let go
        pass


def test_ab_refuses_an_arm_folder_with_another_runs_videos_before_anything_runs(tmp_path, jobs, first_arm):
    out = tmp_path / "ab"
    full = out / "full"
    full.mkdir(parents=True)
    (full / "a-cat-0123456789.mp4").write_bytes(b"a generate run's video")
    (full / "manifest.jsonl").write_text(json.dumps({"schema": 2, "job_id": "f" * 16, "status": "done",
                                                     "outputs": ["a-cat-0123456789.mp4"]}) + "\n")
    before = {p.name: p.read_bytes() for p in full.iterdir()}
    with pytest.raises(InputError) as err:
        ab(jobs, out=out, device="cpu", progress=False)
    assert str(err.value) == (
        f"--out {full}: the 'full' arm's folder holds 1 job(s) in its manifest.jsonl that this arm does not run: not "
        f"made by `sagevideo ab` (e.g. `sagevideo generate --out {full}`); ab would set them aside and render the "
        "arm again, so move them elsewhere, or give ab another --out")
    assert first_arm["ran"] == [] and {p.name: p.read_bytes() for p in full.iterdir()} == before
    (full / "manifest.jsonl").unlink()
    with pytest.raises(InputError, match=r"holds 1 video\(s\) no record names \(a-cat-0123456789\.mp4\)"):
        ab(jobs, out=out, device="cpu", progress=False)


def test_an_unmarked_arm_folder_with_only_this_arms_jobs_is_taken_as_ab_made_it(tmp_path, jobs, first_arm):
    out = tmp_path / "ab"
    planned = generate.plan_batch(jobs, out=out / "full", attention="full", device="cpu")  # as ab plans it
    (out / "full" / "manifest.jsonl").write_text(json.dumps({"schema": 2, "job_id": planned.jobs[0].job_id,
                                                              "status": "failed", "error": "x"}) + "\n")
    with pytest.raises(FirstArmRan):
        ab(jobs, out=out, device="cpu", progress=False)
    assert json.loads((out / "full" / ".sagevideo-ab.json").read_text()) == {"ab_arm": "full"}


def test_ab_arms_claim_every_recipe_arm_folder_first(tmp_path, jobs, first_arm):
    out = tmp_path / "ab"
    (out / "arms" / "fast").mkdir(parents=True)
    (out / "arms" / "fast" / "stray.mp4").write_bytes(b"")
    with pytest.raises(InputError, match=r"--out .*arms/fast: the 'arms/fast' arm's folder holds 1 video\(s\)"):
        ab(jobs, out=out, device="cpu", progress=False, arms=["sage=attention=sage", "fast=attention=sage,pv=fp16"])
    assert first_arm["ran"] == [] and not (out / "arms" / "sage").exists()  # the empty folders planning made: gone
    (out / "arms" / "fast" / "stray.mp4").unlink()
    with pytest.raises(FirstArmRan):
        ab(jobs, out=out, device="cpu", progress=False, arms=["sage=attention=sage", "fast=attention=sage,pv=fp16"])
    assert first_arm["ran"] == ["sage"]
    marks = {p.parent.relative_to(out).as_posix(): json.loads(p.read_text())["ab_arm"]
             for p in out.rglob(".sagevideo-ab.json")}
    assert marks == {".": "", "arms/sage": "arms/sage", "arms/fast": "arms/fast", "full": "full",
                     "full-repeat": "full-repeat"}
