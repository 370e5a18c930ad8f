"""Hostile job files: an alias bomb, values that contain themselves, deep nesting, thousands of
problems. Each is refused at once, in a few bounded lines, before anything is built from it."""

import os
import resource
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import pytest

from sagevideo.errors import InputError
from sagevideo.generation.generate import plan_batch
from sagevideo.jobs.bounds import MAX_PROBLEM_LINES, shown

REPO = Path(__file__).resolve().parents[2]

# "Billion laughs" inside job fields: 9 levels of 9 aliases, a few hundred bytes that PyYAML loads
# at once (an alias is a second reference), ~387 million strings once anything walks them.
ALIAS_BOMB = """\
defaults: {steps: 2}
x: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]
jobs:
  - prompt: a fox
    negative_prompt: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
  - prompt: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
  - prompt: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
  - prompt: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
  - prompt: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
  - prompt: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
  - prompt: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]
  - resolution: [*h,*h,*h,*h,*h,*h,*h,*h,*h]
"""


def _limit_memory():  # a regression must not take the machine's memory with it
    resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))


@pytest.mark.slow
def test_an_alias_bomb_in_job_fields_is_refused_at_once_with_exit_2_and_bounded_memory(tmp_path):
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(ALIAS_BOMB, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "sagevideo", "generate", str(bomb), "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, env=env, timeout=60, preexec_fn=_limit_memory)
    elapsed = time.monotonic() - start
    assert done.returncode == 2, done.stderr[-2000:]
    (line,) = done.stderr.splitlines()
    assert line.startswith(f"sagevideo generate: error: {bomb}: its YAML aliases (*name) expand to ")
    assert "past the 100,000 a job file may add that way (an alias bomb?); write the values out" in line
    assert elapsed < 10  # the interpreter's start included; the refusal itself: the test below
    assert not (tmp_path / "out").exists()


def test_the_alias_bomb_is_refused_before_anything_is_built_from_it(tmp_path, no_model_load):
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(ALIAS_BOMB, encoding="utf-8")
    plan_batch("x", out=tmp_path / "warm")  # imports and the tiny model's configs, outside the measurement
    tracemalloc.start()
    start = time.perf_counter()
    try:
        with pytest.raises(InputError, match=r"aliases \(\*name\) expand to 490,329,036 more values"):
            plan_batch(job_file=bomb, out=tmp_path / "out")
        elapsed = time.perf_counter() - start
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert elapsed < 0.5 and peak < 20e6


def test_aliases_within_the_bound_still_work(tmp_path, no_model_load):
    path = tmp_path / "merge.yaml"
    path.write_text("jobs:\n  - &one {steps: 1, seed: 4, prompt: a}\n  - {<<: *one, prompt: b}\n", encoding="utf-8")
    plan = plan_batch(job_file=path, out=tmp_path / "out")
    assert [(pj.job.prompt, pj.job.seed, pj.job.steps) for pj in plan.jobs] == [("a", 4, 1), ("b", 4, 1)]


@pytest.mark.parametrize("content, message", [
    ("jobs: &j\n  - prompt: a\n    negative_prompt: *j\n",
     r"line 1: a YAML alias \(\*name\) inside the value its anchor \(&name\) names, a value that contains itself"),
    ("jobs:\n  - prompt: " + "[" * 3000 + "]" * 3000 + "\n", r"YAML values nested too deeply to read"),
], ids=["cycle", "deep-yaml"])
def test_a_value_that_contains_itself_or_nests_too_deep_is_refused_in_one_line(tmp_path, content, message):
    path = tmp_path / "bad.yaml"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(InputError, match=message) as err:
        plan_batch(job_file=path, out=tmp_path / "out")
    assert len(str(err.value).splitlines()) == 1


def test_deep_toml_is_refused_in_one_line(tmp_path):
    path = tmp_path / "deep.toml"
    path.write_text("[[jobs]]\nprompt = " + "[" * 3000 + "]" * 3000 + "\n", encoding="utf-8")
    with pytest.raises(InputError, match=r"deep\.toml: TOML values nested too deeply to read"):
        plan_batch(job_file=path, out=tmp_path / "out")


def test_thousands_of_problems_print_twenty_lines_then_how_many_more(tmp_path, no_model_load):
    path = tmp_path / "many.yaml"
    path.write_text("jobs:\n" + "".join(f"  - {{prompt: p{i}, seed: {-1 - i}}}\n" for i in range(3000)),
                    encoding="utf-8")
    with pytest.raises(InputError) as err:
        plan_batch(job_file=path, out=tmp_path / "out")
    lines = str(err.value).splitlines()
    assert len(lines) == MAX_PROBLEM_LINES + 1
    assert lines[0] == f"{path} line 2 (job 1): seed: Input should be greater than or equal to 0 (got -1)"
    assert lines[-1] == "and 2980 more problem(s) like these; fix the ones above and run again"


def test_a_huge_value_is_quoted_in_a_few_characters(tmp_path, no_model_load):
    path = tmp_path / "huge.yaml"
    items = ", ".join(["lol"] * 5_000)  # 25 kB on one line: far past any message line
    path.write_text(f"jobs:\n  - prompt: [{items}]\n    resolution: '{'9' * 100_000}'\n", encoding="utf-8")
    with pytest.raises(InputError) as err:
        plan_batch(job_file=path, out=tmp_path / "out")
    lines = str(err.value).splitlines()
    assert len(lines) == 2 and all(len(line) < 400 for line in lines)
    assert "prompt: Input should be a valid string (got ['lol', 'lol', 'lol', 'lol', ...])" in lines[1]
    assert len(shown("x" * 100_000)) == 80 and "..." in shown("x" * 100_000)
