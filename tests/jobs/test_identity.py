"""Job identity: ids follow what changes a job's output; the render key only what decides its pixels."""

from sagevideo.jobs.identity import JobIdentity
from sagevideo.jobs.specs import JobSpec

SETTINGS = {"model_fingerprint": "0123456789ab", "backend": None, "dtype": "float32", "fps": 8, "plan_sha256": None}
JOB = JobSpec(prompt="a cat", frames=9, height=64, width=64, steps=2, guidance=6.0, attention="full")


def test_names_count_for_the_id_not_for_the_render_key_and_output_forms_for_neither():
    plain = JobIdentity(JOB, SETTINGS)
    named = JobIdentity(JOB.model_copy(update={"name": "hero", "output": "sh010"}), SETTINGS)
    pngs = JobIdentity(JOB.model_copy(update={"frames_png": True}), SETTINGS)
    assert plain.job_id != named.job_id and plain.render_key == named.render_key
    assert plain.job_id == pngs.job_id and plain.render_key == pngs.render_key
    seed = JobIdentity(JOB.model_copy(update={"seed": 1}), SETTINGS)
    model = JobIdentity(JOB, {**SETTINGS, "model_fingerprint": "ba9876543210"})
    assert len({plain.render_key, seed.render_key, model.render_key}) == 3
    assert plain.id_under("ba9876543210") == model.job_id


def test_legacy_ids_are_the_ids_sagevideo_gave_before(tmp_path):
    """Before, a folder's path was among the settings and frames_png counted when on: the tiny
    model's 'a cat' (frames_png off, its name 'tiny' kept) had, and has, the id 162ce1120328f0bc."""
    from sagevideo.generation.plan import plan_batch

    (pj,) = plan_batch(["a cat"], out=tmp_path).jobs
    assert pj.job_id == "162ce1120328f0bc" == pj.identity.legacy_id("tiny", pj.identity.settings["model_fingerprint"])
    pngs = JobIdentity(pj.job.model_copy(update={"frames_png": True}), pj.identity.settings)
    assert pngs.job_id == pj.job_id != pngs.legacy_id("tiny", pj.identity.settings["model_fingerprint"])
