"""bench/results.py and bench/results.jsonl: every row valid, the figures docs/benchmarks.md and its
history cite in it; how a benchmark run adds its rows."""

import argparse
import datetime
import json
import os
import re
from pathlib import Path

import pytest

from bench.results import (
    COMMIT_ENV,
    DEFAULT,
    Result,
    add_results_option,
    append,
    current_commit,
    load,
    one,
    select,
    speedup,
    start_run,
    validate,
    variant,
)
from bench.results import main as results_main

ROOT = Path(__file__).resolve().parents[2]

BENCHMARKS_MD = ROOT / "docs" / "benchmarks.md"
HISTORY_MD = ROOT / "docs" / "benchmarks-history.md"


@pytest.fixture(scope="module")
def rows():
    return load()  # validates every row against bench/results.schema.json


def test_every_row_is_valid_unique_and_written_as_append_writes_it(rows):
    lines = DEFAULT.read_text().splitlines()
    assert len(lines) == len(rows) > 5000
    for line, row in zip(lines, rows, strict=True):
        validate(json.loads(line))
        assert line == json.dumps(row.to_dict(), ensure_ascii=False, separators=(",", ":"))
    keys = [(r.source, r.bench, r.shape, r.variant, r.metric) for r in rows]
    assert len(set(keys)) == len(keys)
    assert {r.gpu for r in rows} == {"NVIDIA H200", "2x NVIDIA H200", "NVIDIA H100 80GB HBM3"}


def test_every_run_the_benchmark_page_cites_has_rows_with_its_figures(rows):
    """Each table row names its run by the start time its rows' source begins with; the figures it
    quotes (ms to 0.1, ratios to 0.01) are those rows' values."""
    text = BENCHMARKS_MD.read_text()
    cited = re.findall(r"\| `(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ)`", text)
    assert len(cited) >= 5
    for start in cited:
        assert any(r.source.startswith(start) for r in rows), start
    forward = {r.shape: r for r in rows if r.source.startswith("2026-12-02T13:58:07Z") and r.metric == "ms"
               and r.variant == "recipe-fp8-compile-sage"}
    assert f"| {forward['wan-14b-720p-81f'].value:.1f} |" in text


def test_every_source_the_history_names_has_rows(rows):
    text = HISTORY_MD.read_text()
    assert "](results/" not in text and "docs/results/NAME" in text  # only the git-history pointer is left
    named = set()
    for name in re.findall(r"sources? `([^`]+)`", text):
        braces = re.fullmatch(r"(.*)\{(.*)\}(.*)", name)
        named |= {f"{braces[1]}{part}{braces[3]}" for part in braces[2].split(",")} if braces else {name}
    named.discard("NAME")  # the header's placeholder
    assert len(named) > 80
    assert named - {r.source for r in rows} == set()


# The 2026-12-01 A/B table: shape, P·V, ms now, ms before, before ÷ now, now × cuDNN, ran.
AB_TABLE = [
    ("cogvideox-2b", "fp8", 8.324, 8.308, 0.998, 1.41, "triton/fp8"),
    ("cogvideox-2b", "fp16", 10.345, 10.359, 1.001, 1.14, "triton/fp16"),
    ("cogvideox-5b", "fp8", 13.445, 13.352, 0.993, 1.38, "triton/fp8"),
    ("cogvideox-5b", "fp16", 16.673, 16.557, 0.993, 1.14, "triton/fp16"),
    ("opensora-256px", "fp8", 1.295, 1.278, 0.987, 1.34, "gluon/fp8"),
    ("opensora-256px", "fp16", 1.858, 1.868, 1.005, 0.92, "triton/fp16"),
    ("opensora-768px", "fp8", 85.259, 85.196, 0.999, 1.38, "gluon/fp8"),
    ("opensora-768px", "fp16", 124.821, 124.850, 1.000, 0.95, "triton/fp16"),
]


@pytest.mark.parametrize("shape,pv,now,before,before_over_now,vs_cudnn,ran", AB_TABLE)
def test_the_2026_12_01_ab_table(rows, shape, pv, now, before, before_over_now, vs_cudnn, ran):
    ab = select(rows, source="2026-12-01-h200-ab-final.json", shape=shape, metric="ms")
    head, base = (one(ab, variant=f"{side}[pv={pv}]") for side in ("head", "base"))
    assert (round(head.value, 3), round(base.value, 3)) == (now, before)
    assert round(base.value / head.value, 3) == before_over_now
    assert round(speedup(rows, head, baseline=f"cudnn[pv={pv}]"), 2) == vs_cudnn
    assert head.extra["ran"] == base.extra["ran"] == ran
    assert base.commit == "0a492ef56ab2f775f935c97b2765fe30dfffa578" and head.commit is None
    assert len(head.extra["reps"]) == 5 and head.value in head.extra["reps"]


def test_the_seventh_session_table(rows):
    final7 = select(rows, source="2026-11-30-h200-final7-bench.json", bench="bench_attention")
    tops = {(r.shape, r.variant): round(r.value) for r in final7 if r.metric == "tops"}
    # CogVideoX-2B: SDPA cuDNN 400, PyPI 408, FP16 call 463, FP8 call 575 (1.44x), FP8 kernel 605 (1.51x, triton)
    assert [tops["cogvideox-2b", v] for v in ("sdpa-cudnn", "pypi-sageattention", "sage-fp16-call",
                                              "sage-fp8-call", "sage-fp8-kernel")] == [400, 408, 463, 575, 605]
    call = one(final7, shape="cogvideox-2b", variant="sage-fp8-call", metric="ms")
    assert round(speedup(final7, call), 2) == 1.44
    kernel = one(final7, shape="cogvideox-2b", variant="sage-fp8-kernel", metric="ms")
    assert round(speedup(final7, kernel), 2) == 1.51 and kernel.extra["kernel"] == "triton"
    # (1,24,75000,128): FP8 call 863 (1.56x), kernel 872 (gluon); the run is commit f80f196's
    assert tops["d128-75k", "sage-fp8-call"] == 863
    assert round(speedup(final7, one(final7, shape="d128-75k", variant="sage-fp8-call", metric="ms")), 2) == 1.56
    assert one(final7, shape="d128-75k", variant="sage-fp8-kernel", metric="tops").extra["kernel"] == "gluon"
    assert {r.commit for r in final7} == {"f80f196f7a34cf11901f381a04d21c94554c646a"}


def test_where_the_time_goes_and_the_forwards(rows):
    sm90 = select(rows, source="2026-11-30-h200-final7-sm90.json", metric="tops")
    assert [round(one(sm90, shape="cogvideox-2b", variant=v).value) for v in ("s2c1", "s2d1c1", "s2d2c1")] == [
        548, 882, 656]
    assert [round(one(sm90, shape="d128-8k", variant=v).value) for v in ("s2c1", "s2d1c1", "s2d2c1")] == [
        835, 1073, 1038]
    # CogVideoX-5B forward: 1796 ms vs 1565 ms, 1.15x, 210 triton/fp8 calls, worst layer 0.99997, output 0.99999
    fwd = select(rows, source="2026-11-30-h200-final7-forward-cogvideox5b.json")
    assert round(one(fwd, variant="sdpa-cudnn", metric="ms").value) == 1796
    sage = one(fwd, variant="sagevideo-fp8", metric="ms")
    assert round(sage.value) == 1565 and sage.extra["backends"] == {"triton/fp8": 210}
    assert round(one(fwd, metric="speedup").value, 2) == 1.15
    assert round(one(fwd, metric="layer_cos_worst_min").value, 5) == 0.99997
    assert round(one(fwd, metric="output_cos_vs_sdpa").value, 5) == 0.99999


def test_edge_cases_before_and_after(rows):
    base = select(rows, source="2026-12-01-h200-edge-base.json")
    head = select(rows, source="2026-12-01-h200-edge-head.json")
    where = {"shape": "q,k x1000 d64", "variant": "sagevideo[pv=fp8]", "metric": "nonfinite"}
    assert one(base, **where).value == 609152 and one(head, **where).value == 0
    assert {r.commit for r in base} == {"0a492ef56ab2f775f935c97b2765fe30dfffa578"}
    # > 2^31 elements: an illegal memory access before, finite after with the last row's cosine
    for case, pv, cos in [("2^31-gluon", "fp8", 0.99905), ("2^31-plain-d64", "fp8", 0.99903),
                          ("2^31-plain-d128-fp16", "fp16", 0.99992)]:
        assert "illegal memory access" in one(base, shape=case, metric="error").extra["error"]
        assert one(head, shape=case, variant=f"sagevideo[pv={pv}]", metric="last_row_cos").value == cos


def test_two_gpus(rows):
    sp = select(rows, source="2026-11-30-h200x2-ulysses-token-major.json", metric="ms")
    assert [round(one(sp, variant=v).value, 1) for v in ("sage-1gpu", "sage-2gpu", "sdpa-1gpu", "sdpa-2gpu")] == [
        1679.7, 872.1, 1777.1, 955.7]
    batch = select(rows, source="2026-11-30-h200x2-batch-throughput.json")
    steady = [round(one(batch, variant=f"ray[workers={n}]", metric="steady_jobs_per_min").value, 1) for n in (1, 2)]
    assert steady == [11.6, 22.6]
    assert round(one(batch, metric="ratio_steady").value, 2) == 1.95


def test_append_then_load_round_trips_and_refuses_bad_rows(tmp_path):
    path = tmp_path / "results.jsonl"
    good = Result(bench="bench_attention", shape="cogvideox-2b", variant="sage-fp8-call", metric="ms", value=8.4,
                  gpu="NVIDIA H200", date="2026-12-02", source="test", commit="abc1234", extra={"reps": [8.4]})
    assert append([good], path) == 1
    assert load(path) == [good]
    assert one(load(path), metric="ms") == good and select(load(path), metric="tops") == []

    bad = Result(**{**good.__dict__, "date": "yesterday"})
    with pytest.raises(ValueError, match="date"):
        append([good, bad], path)
    assert len(load(path)) == 1  # nothing of the refused batch was written
    with pytest.raises(ValueError, match="not finite"):
        append([Result(**{**good.__dict__, "value": float("inf")})], path)

    path.write_text(path.read_text() + '{"bench": "x"}\n')
    with pytest.raises(ValueError, match=r"results.jsonl:2: .*'shape' is a required property"):
        load(path)
    with pytest.raises(TypeError, match="unknown fields"):
        select([good], benchmark="bench_attention")
    with pytest.raises(LookupError, match="0 rows"):
        one([good], metric="tops")


def test_append_refuses_a_row_already_in_the_file_or_twice_in_the_batch(tmp_path):
    path = tmp_path / "results.jsonl"
    row = Result(bench="bench_attention", shape="cogvideox-2b", variant="sage-fp8-call", metric="ms", value=8.4,
                 gpu="NVIDIA H200", date="2026-12-02", source="run 1")
    append([row], path)
    with pytest.raises(ValueError, match="already in"):
        append([Result(**{**row.__dict__, "value": 8.5})], path)  # the same number measured "again"
    with pytest.raises(ValueError, match="twice"):
        append([Result(**{**row.__dict__, "source": "run 2"})] * 2, path)
    assert append([Result(**{**row.__dict__, "source": "run 2"})], path) == 1  # another run: a new row
    assert len(load(path)) == 2


def test_a_run_names_its_rows_and_skips_what_was_not_measured(monkeypatch):
    monkeypatch.setenv(COMMIT_ENV, "0a492ef56ab2f775f935c97b2765fe30dfffa578")
    now = datetime.datetime(2026, 12, 2, 9, 30, tzinfo=datetime.timezone.utc)
    for name in [k for k in os.environ if k.startswith("TORCHINDUCTOR_")]:
        monkeypatch.delenv(name)
    run = start_run("bench_attention", "NVIDIA H200", ["--shapes", "cogvideox-2b"], now=now)
    assert run.source == "2026-12-02T09:30:00Z python -m bench.bench_attention --shapes cogvideox-2b"
    monkeypatch.setenv("TORCHINDUCTOR_COORDINATE_DESCENT_TUNING", "1")  # changes the compiled code: named
    tuned = start_run("bench_attention", "NVIDIA H200", ["--shapes", "cogvideox-2b"], now=now)
    assert tuned.source == ("2026-12-02T09:30:00Z TORCHINDUCTOR_COORDINATE_DESCENT_TUNING=1 "
                            "python -m bench.bench_attention --shapes cogvideox-2b")
    assert (run.date, run.commit) == ("2026-12-02", "0a492ef56ab2f775f935c97b2765fe30dfffa578")
    run.add("cogvideox-2b", variant("sage-kernel", pv="fp8", block_m=64, max_registers=None, by_add=True), "ms",
            8.0, reps=[8.0, 8.1], kernel=None)
    run.add("cogvideox-2b", "sdpa-flash", "ms", None)  # not measured: no row
    run.add("cogvideox-2b", "sage-fp8-call", "cos_worst", float("nan"))
    run.add("cogvideox-2b", "base", "ms", 9.0, commit="abc1234")
    run.add("case", "sagevideo", "finite", True)
    ms, nan, base, finite = run.rows
    assert ms.variant == "sage-kernel[pv=fp8,block_m=64,max_registers=auto,by_add=on]"
    assert ms.extra == {"reps": [8.0, 8.1]} and ms.commit == run.commit and ms.gpu == "NVIDIA H200"
    assert (nan.metric, nan.value, nan.unit) == ("cos_worst_is_nan", 1.0, "bool")
    assert base.commit == "abc1234"
    assert (finite.value, finite.unit) == (1.0, "bool")
    for row in run.rows:
        validate(row.to_dict())


def test_the_commit_comes_from_git_or_from_BENCH_COMMIT(monkeypatch, tmp_path):
    monkeypatch.delenv(COMMIT_ENV, raising=False)
    commit, _ = current_commit()
    assert commit is not None and len(commit) == 40  # this checkout
    assert current_commit(tmp_path) == (None, False)  # no git there: unknown, the row says null
    run = start_run("edge_cases", "cpu", [], root=tmp_path)
    assert run.commit is None and not run.source.endswith("(uncommitted changes)")
    monkeypatch.setenv(COMMIT_ENV, "HEAD")
    with pytest.raises(ValueError, match="BENCH_COMMIT='HEAD'"):
        current_commit()


def test_the_append_results_option_defaults_to_the_results_file():
    parser = argparse.ArgumentParser()
    add_results_option(parser)
    assert parser.parse_args([]).append_results is None
    assert parser.parse_args(["--append-results"]).append_results == DEFAULT
    assert parser.parse_args(["--append-results", "x.jsonl"]).append_results == Path("x.jsonl")


def test_add_moves_a_gpu_runs_rows_into_the_results_file(tmp_path, capsys):
    run_file, results = tmp_path / "run.jsonl", tmp_path / "results.jsonl"
    rows = [Result(bench="bench_attention", shape="cogvideox-2b", variant=v, metric="ms", value=1.0,
                   gpu="NVIDIA H200", date="2026-12-02", source="run") for v in ("a", "b")]
    append(rows, run_file)
    assert results_main(["add", str(run_file), "--to", str(results)]) == 0
    assert load(results) == rows and "2 rows added" in capsys.readouterr().out
    assert results_main(["add", str(run_file), "--to", str(results)]) == 2  # already there: refused
    assert "already in" in capsys.readouterr().err and len(load(results)) == 2
