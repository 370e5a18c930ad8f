"""Help texts say what the code does (the README corrections of issue "Nothing lost, round 2", item 17)."""

from __future__ import annotations

import re

from typer.testing import CliRunner

from sagevideo.cli.app import app


def help_of(monkeypatch, *argv) -> str:
    monkeypatch.setenv("COLUMNS", "400")  # one line per option: the phrases are not wrapped apart
    result = CliRunner().invoke(app, [*argv, "--help"])
    assert result.exit_code == 0, result.output
    return re.sub(r"[\s│]+", " ", result.output)


def test_gpus_per_job_names_every_family_that_splits_and_the_degree_rule(monkeypatch):
    from sagevideo.pipelines import families

    text = help_of(monkeypatch, "generate")
    gpus_help = text[text.index("--gpus-per-job"):][:400]
    splitting = [f.title for f in families.every() if f.generates and f.sequence_parallel]
    others = [f.title for f in families.every() if not (f.generates and f.sequence_parallel)]
    assert splitting and all(title in gpus_help for title in splitting), gpus_help
    assert not any(f"{title}," in gpus_help or f"{title};" in gpus_help for title in others), gpus_help
    assert "divide the model's attention heads" in gpus_help


def test_ab_says_when_exit_2_can_come_after_the_arms_ran(monkeypatch):
    text = help_of(monkeypatch, "ab")
    assert "2 bad input (checked before any arm runs) or arms whose videos do not pair (found when evaluating, " \
           "after they ran)" in text


def test_simulate_qkv_names_the_command_that_writes_it(monkeypatch):
    assert "written by `sagevideo calibrate --save-qkv FILE`" in help_of(monkeypatch, "simulate")

