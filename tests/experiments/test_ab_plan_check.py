"""experiments/ab.py's checks of the quantized arm against its plan and its clean-up (the runs
themselves: tests/experiments/test_ab.py; the job-file check: ABConfig.checked_job_file there)."""

from collections import Counter

LAYERS = ["transformer_blocks.0.attn1", "transformer_blocks.1.attn1"]


def test_plan_check_counts_calls_per_precision():
    from sagevideo.experiments.ab import expected_calls, plan_check
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


def test_empty_folders_planning_made_are_removed_deepest_first(tmp_path):
    from sagevideo.experiments.ab import _remove_empty as remove_empty

    made = [tmp_path / "out", tmp_path / "out" / "arms", tmp_path / "out" / "arms" / "a"]
    made[2].mkdir(parents=True)
    (tmp_path / "keep").mkdir()
    (tmp_path / "keep" / "file").write_text("x")
    remove_empty([*made, tmp_path / "keep"])
    assert not (tmp_path / "out").exists() and (tmp_path / "keep" / "file").exists()
