"""What a run did (`generation/report.py`): counts from the records and the one summary line."""

from __future__ import annotations

from sagevideo.generation.generate import plan_batch
from sagevideo.generation.report import BatchReport
from sagevideo.outputs.manifest import ManifestRecord


def test_the_summary_counts_records_and_the_attention_that_ran(tmp_path):
    plan = plan_batch(["a", "b"], out=tmp_path)
    report = BatchReport(plan=plan, records=[None, None])
    said = []
    done = ManifestRecord(job_id=plan.jobs[0].job_id, status="done",
                          backends={"counts": {"reference/fp16": 4}, "fallbacks": {}})
    failed = ManifestRecord(job_id=plan.jobs[1].job_id, status="failed", error="NonFiniteError: NaN", attempts=2)
    report.add(0, done, said.append)
    report.add(1, failed, said.append)
    assert (report.done, report.failed, report.retried, report.ok) == (1, 1, 1, False)
    assert said == [f"sagevideo: job {failed.job_id} (job 2) failed: NonFiniteError: NaN"]
    line = report.summary_line()
    assert line.startswith("sagevideo: 1 done, 0 skipped, 1 failed → ") and "attention: reference/fp16 x4" in line
    assert "1 job(s) retried after a worker died" in line


def _sparse_record(plan, index, layers):
    sparse = {"layers": layers, "steps": {}, "dense": {}}
    backends = {"counts": {"reference/fp16": 4}, "fallbacks": {}, "sparse": sparse}
    return ManifestRecord(job_id=plan.jobs[index].job_id, status="done", backends=backends)


def test_the_summary_says_how_many_calls_ran_sparse_at_what_density(tmp_path):
    """Wan-like records (`BackendLog.sparse_summary`): the first layer dense by the plan, a
    self-attention layer sparse, a cross-attention layer the plan made sparse that ran dense for its
    family's reason; summed over two jobs, the density being the sparse calls' own."""
    plan = plan_batch(["a", "b"], out=tmp_path, sparse="static:0.15")
    never = "a layer its family never makes sparse (cross-attention or text only)"
    layers = {
        "blocks.0.attn1": {"calls": 5, "density": 1.0, "min": 1.0},
        "blocks.1.attn1": {"calls": 5, "density": 0.4, "min": 0.25, "sparse_calls": 4, "sparse_density": 0.25},
        "blocks.1.attn2": {"calls": 5, "density": 1.0, "min": 1.0, "sparse_calls": 4, "sparse_density": 1.0,
                           "dense": {never: 4}},
    }
    report = BatchReport(plan=plan, records=[None, None])
    report.add(0, _sparse_record(plan, 0, layers), print)
    report.add(1, _sparse_record(plan, 1, layers), print)
    line = report.summary_line()
    assert (f"; block-sparse: 8 of 30 calls at density 0.25, 14 dense by the plan, 8 planned sparse that ran dense "
            f"({never})") in line


def test_the_summary_says_when_every_tile_was_kept_or_nothing_ran_sparse(tmp_path):
    plan = plan_batch(["a"], out=tmp_path, sparse="dynamic:0.15")
    kept = {"blocks.1.attn1": {"calls": 3, "density": 1.0, "min": 1.0, "sparse_calls": 3, "sparse_density": 1.0}}
    report = BatchReport(plan=plan, records=[None])
    report.add(0, _sparse_record(plan, 0, kept), print)
    assert "; block-sparse: 3 of 3 calls at density 1.00 (every tile kept at this size or on these inputs)" in (
        report.summary_line())
    dense = {"blocks.0.attn1": {"calls": 2, "density": 1.0, "min": 1.0}}
    report = BatchReport(plan=plan, records=[None])
    report.add(0, _sparse_record(plan, 0, dense), print)
    assert "; block-sparse: none of 2 calls ran sparse" in report.summary_line()


def test_a_run_without_sparse_choices_says_nothing_of_them(tmp_path):
    plan = plan_batch(["a"], out=tmp_path)
    report = BatchReport(plan=plan, records=[None])
    report.add(0, ManifestRecord(job_id=plan.jobs[0].job_id, status="done",
                                 backends={"counts": {"reference/fp16": 4}, "fallbacks": {}}), print)
    assert "block-sparse" not in report.summary_line()


def test_the_summary_says_when_sequence_parallel_ranks_were_unevenly_loaded(tmp_path):
    """`rank_spread` (the most loaded rank's density over the ranks' mean, per layer) above 1.1 is
    said with its layer; balanced ranks say nothing."""
    plan = plan_batch(["a"], out=tmp_path, sparse="dynamic:0.15")
    layer = {"calls": 2, "density": 0.3, "min": 0.3, "sparse_calls": 2, "sparse_density": 0.3}
    layers = {"blocks.1.attn1": dict(layer, rank_spread=1.04), "blocks.2.attn1": dict(layer, rank_spread=1.42)}
    report = BatchReport(plan=plan, records=[None])
    report.add(0, _sparse_record(plan, 0, layers), print)
    assert report.summary_line().endswith(
        "; block-sparse: 4 of 4 calls at density 0.30, sequence-parallel ranks unevenly loaded (up to 1.42x their "
        "mean, blocks.2.attn1)")
    layers["blocks.2.attn1"]["rank_spread"] = 1.05
    report = BatchReport(plan=plan, records=[None])
    report.add(0, _sparse_record(plan, 0, layers), print)
    assert "unevenly" not in report.summary_line()
