"""jobs/problems.py: how input problems are said (fields, options, places, one line per problem)."""

import pytest
from pydantic import ValidationError

from sagevideo.jobs.problems import group_problems, option_place, problem_parts, value_problems, where
from sagevideo.jobs.specs import JobSpec


def test_a_misspelt_field_gets_a_suggestion_and_a_bad_value_shows_what_was_given():
    with pytest.raises(ValidationError) as caught:
        JobSpec(prompt="a", stesp=2, seed=-1)
    parts = {field: (msg, shown) for field, msg, shown in problem_parts(caught.value)}
    assert parts["stesp"][0] == "unknown field; remove it or check its spelling (did you mean 'steps'?)"
    assert parts["seed"][1] == " (got -1)"


def test_options_are_named_as_typed_flags_included():
    assert option_place("steps", 0) == "--steps 0"
    assert option_place("progress", False) == "--no-progress" and option_place("progress", True) == "--progress"
    with pytest.raises(ValidationError) as caught:
        JobSpec(prompt="a", steps=0)
    assert [(field, place) for field, place, _ in value_problems(caught.value)] == [("steps", "--steps 0")]


def test_one_line_per_distinct_problem_listing_its_places():
    problems = [(f"job {i}", "frames: must be 4k+1") for i in range(1, 6)] + [("job 2", "seed: negative")]
    assert group_problems(problems).splitlines() == [
        "job 1, job 2, job 3 and 2 more: frames: must be 4k+1", "job 2: seed: negative"]


def test_a_place_is_a_label_or_what_an_origin_says_of_a_field():
    class Origin:
        def at(self, field):
            return f"jobs.yaml line 3 ({field})"

    assert where("prompts.txt line 2", "seed") == "prompts.txt line 2"
    assert where(Origin(), "seed") == "jobs.yaml line 3 (seed)"
