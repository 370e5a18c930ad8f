"""`--sparse` as a setting (`jobs/sparse.py`): one canonical text, ids of dense jobs unchanged, and the
settings it does not compose with, each said with its fix."""

import pytest
from pydantic import ValidationError

from sagevideo.jobs.identity import job_id
from sagevideo.jobs.sparse import SparseOptions, is_sparse, job_sparse_problem
from sagevideo.jobs.specs import JobSpec


def test_settings_are_kept_in_one_canonical_text():
    assert SparseOptions().sparse == "off" and not is_sparse("off") and not is_sparse(None)
    assert SparseOptions(sparse=" Dynamic:.15").sparse == "dynamic:0.15" and is_sparse("dynamic:0.15")
    assert SparseOptions(sparse=False).sparse == "off"  # YAML reads a bare `off` as false
    assert JobSpec(prompt="a", sparse="static:1").sparse == "static:1.0"
    for bad in ("dynamic:0", "sparse", 0.15, True):
        with pytest.raises(ValidationError, match="METHOD:DENSITY"):
            SparseOptions(sparse=bad)


def test_a_dense_job_keeps_the_id_it_had_before_the_setting_existed():
    job = JobSpec(prompt="a cat", steps=3, attention="sage", pv="fp16")
    settings = {"backend": "reference"}
    before = "387df96695810d8d"  # this job's id as sagevideo gave it before `sparse` was a job field
    assert job_id(job, settings) == before
    assert job_id(job.model_copy(update={"sparse": "off"}), settings) == before
    assert job_id(job.model_copy(update={"sparse": "dynamic:0.15"}), settings) != before


def test_what_sparse_does_not_compose_with_is_said_with_the_fix():
    assert job_sparse_problem("off", "full", "p.json") is None
    assert job_sparse_problem("dynamic:0.15", "sage", None) is None
    assert "use sparse off or attention sage" in job_sparse_problem("dynamic:0.15", "full", None)
    assert "put the sparse setting in the plan" in job_sparse_problem("static:0.2", "sage", "p.json")
