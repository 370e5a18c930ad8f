"""A prompt longer than the text encoder reads: one note per job before the run (how many tokens
are dropped, counted with the pipeline's tokenizer), and the libraries' truncation warnings
(the whole cut text, once per encode) kept off the console while it runs."""

import logging
import textwrap

import pytest

from sagevideo.generation.generate import plan_batch
from sagevideo.jobs.specs import JobSpec
from sagevideo.pipelines.loading import resolve_model
from sagevideo.pipelines.runner import run_job
from sagevideo.pipelines.truncation import quiet_prompt_truncation

LONG = "fox " * 25_000  # 100,000 characters: the tiny model's byte-level tokenizer makes a token of each


def dropped_notes(plan):
    return [n for n in plan.notes if "are dropped" in n]


def test_a_prompt_past_the_text_encoder_gets_one_note_per_job_with_the_tokens_dropped(tmp_path, no_model_load):
    shots = tmp_path / "shots.yaml"
    shots.write_text(textwrap.dedent(f"""\
        jobs:
          - prompt: a short one
          - prompt: {LONG}
            seed: 1
          - prompt: {LONG}
            seed: 2
            negative_prompt: {"blurry " * 40}
        """), encoding="utf-8")
    plan = plan_batch(job_file=shots, out=tmp_path / "out")
    limit = resolve_model("tiny").text_tokens  # 226, as CogVideoX's
    said = f"100,000 T5 tokens, but CogVideoX reads {limit}: the last {100_000 - limit:,} are dropped"
    assert dropped_notes(plan) == [
        f"{shots} line 3 (job 2): prompt: {said} (the video follows the first part only); shorten it to keep them",
        f"{shots} line 5 (job 3): prompt: {said} (the video follows the first part only); shorten it to keep them",
        f"{shots} line 7 (job 3): negative_prompt: 280 T5 tokens, but CogVideoX reads {limit}: the last "
        f"{280 - limit} are dropped (the video follows the first part only); shorten it to keep them",
    ]
    assert dropped_notes(plan_batch("a prompt the encoder reads whole", out=tmp_path / "out")) == []


def test_the_cut_text_is_not_logged_while_the_job_runs_and_other_warnings_still_are(tiny_pipe):
    seen = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())
    roots = [logging.getLogger("diffusers"), logging.getLogger("transformers")]  # where the libraries' lines go
    for root in roots:
        root.addHandler(handler)
    try:
        job = resolve_model("tiny").resolve(JobSpec(prompt=LONG))
        run_job(tiny_pipe, job, text_tokens=32)
        with quiet_prompt_truncation():
            logging.getLogger("transformers.tokenization_utils_base").warning(
                "Token indices sequence length is longer than the specified maximum sequence length for this model "
                "(100001 > 226). Running this sequence through the model will result in indexing errors")
            logging.getLogger("diffusers.pipelines.cogvideo.pipeline_cogvideox").warning("another warning")
    finally:
        for root in roots:
            root.removeHandler(handler)
    assert seen == ["another warning"]


@pytest.mark.parametrize("text, expected", [("", None), ("x" * 56, None), ("x" * 300, 301)])
def test_short_texts_are_not_counted(text, expected):
    from sagevideo.pipelines.truncation import dropped_tokens_note

    counted = []

    def count(t):
        counted.append(t)
        return len(t) + 1

    note = dropped_tokens_note("prompt", text, count, 226, "tokens, but the model reads")
    assert (counted == []) == (expected is None) and (note is None) == (expected is None)
