"""experiments/ab_runs.py: ab's checks of the job file and of the quantized arm against its plan
(the runs themselves: tests/experiments/test_ab.py)."""

from collections import Counter

import pytest

from sagevideo.errors import InputError

LAYERS = ["transformer_blocks.0.attn1", "transformer_blocks.1.attn1"]


def test_plan_check_counts_calls_per_precision():
    from sagevideo.experiments.ab_runs import expected_calls, plan_check
    from sagevideo.pipelines.plans import AttentionPlan

    plan = AttentionPlan.model_validate(
        {
            "layers": LAYERS,
            "default": {"mode": "int8-fp8"},
            "overrides": [{"layers": [LAYERS[0]], "steps": [0, 1], "mode": "full"}],
        }
    )
    assert expected_calls(plan, 2) == Counter({"fp8": 3, "full": 1})
    from sagevideo.outputs.manifest import ManifestRecord

    backends = {"counts": {"reference/fp8": 3, "sdpa": 1}, "fallbacks": {}}
    record = ManifestRecord(job_id="j", prompt="p", steps=2, backends=backends)
    assert plan_check(plan, [record])["consistent"] is True
    uniform = record.replace(backends={"counts": {"reference/fp16": 4}, "fallbacks": {}})
    check = plan_check(plan, [uniform])
    assert check["consistent"] is False and "record the plan without applying it" in check["message"]
    assert "ran {'fp16': 4}, the plan implies {'fp8': 3, 'full': 1}" in check["message"]


def test_the_job_file_must_exist_and_leave_the_arm_fields_to_ab(tmp_path):
    from sagevideo.experiments.ab_runs import checked_job_file

    with pytest.raises(InputError, match=r"JOB_FILE .*missing.yaml: no such file"):
        checked_job_file(tmp_path / "missing.yaml", "ab sets them")
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text("jobs:\n  - prompt: a\n    plan: p.json\n")
    with pytest.raises(InputError, match=r"sets job 1: plan: ab sets them; remove them from the job file"):
        checked_job_file(jobs, "ab sets them")
    jobs.write_text("jobs:\n  - a fox\n")
    assert checked_job_file(jobs, "ab sets them") == jobs


def test_empty_folders_planning_made_are_removed_deepest_first(tmp_path):
    from sagevideo.experiments.ab_runs import remove_empty

    made = [tmp_path / "out", tmp_path / "out" / "arms", tmp_path / "out" / "arms" / "a"]
    made[2].mkdir(parents=True)
    (tmp_path / "keep").mkdir()
    (tmp_path / "keep" / "file").write_text("x")
    remove_empty([*made, tmp_path / "keep"])
    assert not (tmp_path / "out").exists() and (tmp_path / "keep" / "file").exists()
