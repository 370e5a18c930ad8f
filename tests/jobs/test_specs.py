"""Job specs: output names (sanitized, inside the output folder), job ids (stable and
setting-sensitive), resolution forms."""

import pytest

import sagevideo
from sagevideo.generation.generate import plan_batch
from sagevideo.jobs.specs import JobSpec


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


@pytest.mark.parametrize(
    "value, width_height",
    [("720x480", (720, 480)), (" 64 X 32 ", (64, 32)), ([64, 32], (64, 32)), ("64*32", (64, 32))],
)
def test_resolution_forms(value, width_height):
    job = JobSpec(prompt="x", resolution=value)
    assert (job.width, job.height) == width_height
