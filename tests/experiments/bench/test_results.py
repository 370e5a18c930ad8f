"""`experiments/bench/results.py`: the rows, their schema-driven validation (no jsonschema needed
to write them), append's refusals, a run's source."""

import datetime
import json
from pathlib import Path

import pytest

from sagevideo.experiments.bench import results
from sagevideo.experiments.bench.results import SCHEMA, Result, append, load, start_run, validate

REPOSITORY_ROWS = Path(__file__).resolve().parents[3] / "bench" / "results.jsonl"
GOOD = {"bench": "b", "shape": "s", "variant": "v", "metric": "ms", "value": 1.5, "gpu": "NVIDIA H200",
        "commit": None, "date": "2026-12-01", "source": "run.json"}
BAD = [
    {**GOOD, "metric": "Ms"},  # pattern
    {**GOOD, "value": "1"},  # type
    {**GOOD, "value": True},  # a boolean is not a number
    {**GOOD, "date": "2026-13-01"},  # format date
    {**GOOD, "commit": "HEAD"},  # pattern
    {**GOOD, "shape": ""},  # minLength
    {**GOOD, "colour": "red"},  # additionalProperties
    {k: v for k, v in GOOD.items() if k != "gpu"},  # required
]


@pytest.mark.parametrize("row", [GOOD, *BAD])
def test_validation_agrees_with_jsonschema_on_the_schema_file(row):
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads(SCHEMA.read_text())
    checker = jsonschema.validators.validator_for(schema)(schema, format_checker=jsonschema.FormatChecker())
    want = not list(checker.iter_errors(row))
    try:
        validate(row)
        got = True
    except ValueError:
        got = False
    assert got == want, row


def test_the_repository_rows_all_validate():
    assert len(load(REPOSITORY_ROWS)) > 1000


def test_append_refuses_a_row_already_there_and_writes_nothing(tmp_path):
    path = tmp_path / "r.jsonl"
    assert append([Result(**GOOD)], path) == 1
    with pytest.raises(ValueError, match="not a new result row"):
        append([Result(**{**GOOD, "metric": "tops"}), Result(**GOOD)], path)
    assert len(load(path)) == 1


def test_a_runs_source_is_its_start_and_command(monkeypatch):
    monkeypatch.setenv(results.COMMIT_ENV, "abcdef0")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/c")
    run = start_run("sagevideo.bench.forward", "cpu", "sagevideo bench forward model=tiny-wan",
                    now=datetime.datetime(2026, 12, 3, 10, 0, tzinfo=datetime.timezone.utc))
    assert run.source == "2026-12-03T10:00:00Z TORCHINDUCTOR_CACHE_DIR=/c sagevideo bench forward model=tiny-wan"
    assert (run.commit, run.date) == ("abcdef0", "2026-12-03")
