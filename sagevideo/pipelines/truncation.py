"""Prompts longer than the text encoder reads: counted before the run, quiet while it runs.

A pipeline cuts a prompt to its `max_sequence_length` (CogVideoX: 226 T5 tokens) and diffusers
logs the whole cut text (a 100,000-character prompt gave 201 KB of warnings, once per encode),
transformers' tokenizer adds its own line. sagevideo says it once per job instead, before anything
loads, with the number of tokens dropped (`dropped_tokens_note`, through the family's
`ModelFamily.job_notes`), and `quiet_prompt_truncation` keeps those library lines off the
console while a job runs; every other library warning still shows.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator

# What diffusers' text encoders (`_get_t5_prompt_embeds`...) and transformers' tokenizers log for a cut prompt.
TRUNCATION_MESSAGES = (
    "The following part of your input was truncated",
    "Token indices sequence length is longer than the specified maximum sequence length",
)
_LIBRARY_LOGGERS = ("diffusers.pipelines.", "transformers.tokenization")


class _DropTruncation(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(TRUNCATION_MESSAGES)


@contextlib.contextmanager
def quiet_prompt_truncation() -> Iterator[None]:
    """While inside: the truncation warnings of diffusers' pipelines and transformers' tokenizers
    dropped at the loggers that emit them (each module's own logger, whatever handlers the
    libraries or the user set up; Ray workers forward nothing then)."""
    loggers = [logger for name, logger in list(logging.root.manager.loggerDict.items())
               if isinstance(logger, logging.Logger) and name.startswith(_LIBRARY_LOGGERS)]
    drop = _DropTruncation()
    for logger in loggers:
        logger.addFilter(drop)
    try:
        yield
    finally:
        for logger in loggers:
            logger.removeFilter(drop)


def dropped_tokens_note(field: str, text: str, count: Callable[[str], int | None], limit: int,
                        what: str) -> str | None:
    """'prompt: 25,001 T5 tokens, but CogVideoX reads 226: ...' when `text` is longer than the
    `limit` tokens the pipeline reads (the end-of-text token included), else None. count: text ->
    tokens with the pipeline's tokenizer (None: no tokenizer to count with, no note); `what`:
    e.g. 'T5 tokens, but CogVideoX reads'. A text of at most (limit - 1) / 4 characters is not
    counted (no tokenizer loaded for it): none here makes more than 4 tokens of a character (a
    UTF-8 byte each)."""
    if not text or len(text) * 4 + 1 <= limit:
        return None
    tokens = count(text)
    if tokens is None or tokens <= limit:
        return None
    return (f"{field}: {tokens:,} {what} {limit}: the last {tokens - limit:,} are dropped (the video follows the "
            "first part only); shorten it to keep them")
