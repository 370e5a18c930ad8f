"""Naming jobs (`jobs/naming.py`): ids from the job and its settings, output names, the same job
once, and an `output:` that is another job's automatic name refused."""

from __future__ import annotations

from sagevideo.jobs.naming import identity_settings, name_jobs
from sagevideo.jobs.specs import JobSpec

SETTINGS = identity_settings(fingerprint="f", backend="reference", dtype="float32", fps=8, plan_sha256=None)


def test_ids_names_and_duplicates():
    jobs = [(JobSpec(prompt="a red panda"), "job 1"), (JobSpec(prompt="a red panda"), "job 2"),
            (JobSpec(prompt="a fox", output="fox"), "job 3")]
    naming = name_jobs(jobs, lambda job: SETTINGS)
    assert [n.label for n in naming.jobs] == ["job 1", "job 3"]  # the same job runs once
    panda, fox = naming.jobs
    assert panda.output == f"a-red-panda-{panda.job_id[:10]}.mp4" and fox.output == "fox.mp4"
    assert naming.problems == [] and naming.notes == ["1 duplicate job(s) (same prompt and settings) will run once"]


def test_settings_change_the_id_and_only_given_extras_count():
    job = [(JobSpec(prompt="a"), "job 1")]
    plain = name_jobs(job, lambda j: SETTINGS).jobs[0]
    other = name_jobs(job, lambda j: {**SETTINGS, "backend": "triton"}).jobs[0]
    assert plain.job_id != other.job_id
    assert "image_sha256" not in SETTINGS and "recipe" not in SETTINGS and "model" not in SETTINGS
    extras = identity_settings(fingerprint="f", backend=None, dtype="bfloat16", fps=16, plan_sha256="p",
                               tiny_model="tiny", image_sha256="i", recipe={"compile": "full"})
    assert (extras["model"], extras["image_sha256"], extras["recipe"]) == ("tiny", "i", {"compile": "full"})


def test_an_output_equal_to_another_jobs_automatic_name_is_refused():
    first = name_jobs([(JobSpec(prompt="a cat"), "job 1")], lambda j: SETTINGS).jobs[0]
    stem = first.output.removesuffix(".mp4")
    naming = name_jobs([(JobSpec(prompt="a cat"), "job 1"), (JobSpec(prompt="b", output=stem), "job 2")],
                       lambda j: SETTINGS)
    (problem,) = naming.problems
    assert problem[0] == "job 2" and "is the automatic output name of job 1" in problem[1]
