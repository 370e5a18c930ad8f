"""Reading a user's text files: the UTF-8 text of an input file, and a prompts file (one prompt per
line) that refuses a YAML/TOML job file under another extension."""

from __future__ import annotations

import re
from pathlib import Path

from sagevideo.errors import InputError
from sagevideo.jobs.bounds import shown as shown_value


def read_text_file(path: str | Path, what: str, expected: str) -> str:
    """The UTF-8 text of a user's input file; InputError naming `what` it is when it cannot be read."""
    path = Path(path)
    if not path.exists():
        raise InputError(f"{what} {path} does not exist; give {expected}")
    if not path.is_file():
        raise InputError(f"{what} {path} is not a file; give {expected}")
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise InputError(
            f"{what} {path} is not UTF-8 text ({err.reason} at byte {err.start}); save it as UTF-8"
        ) from None
    except OSError as err:
        raise InputError(f"{what} {path} cannot be read: {err.strerror}") from None


# Lines of a YAML or TOML job file that no prompt starts with: a top-level section (`jobs:`,
# `{jobs: ...}`, `jobs = ...`), a TOML table header (`[defaults]`, `[[jobs]]`), a bare list's job
# (`- prompt: ...`). Read as prompts, each would become a video.
_JOB_FILE_LINE = re.compile(
    r"""^(\{\s*)?(?P<q>["']?)(recipe|defaults|jobs)(?P=q)\s*(:(\s|$)|=)"""
    r"""|^\s*\[\[?\s*(recipe|defaults|jobs)\s*\]\]?\s*(\#.*)?$"""
    r"""|^-\s+(?P<p>["']?)prompt(?P=p)\s*:(\s|$)"""
)


def read_prompts_file(path: str | Path) -> list[tuple[str, str]]:
    """Prompts of a text file, one per line; blank lines and lines starting with '#' are skipped.

    Returns (prompt, "FILE line N") pairs so that errors can point at the line. A file with lines
    that only a job file has (`_JOB_FILE_LINE`: `defaults: {steps: 2}`, `[[jobs]]`, ...) is
    refused: it is a job file under another extension (rename it), or its prompt needs rewording.
    """
    path = Path(path)
    text = read_text_file(path, "prompts file", "a text file with one prompt per line")
    prompts, structured = [], []
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            prompts.append((stripped, f"{path} line {number}"))
            if _JOB_FILE_LINE.match(line):
                structured.append((number, stripped))
    if structured:
        (number, line), more = structured[0], len(structured) - 1
        others = f" (and {more} more such line{'s' if more > 1 else ''})" if more else ""
        raise InputError(
            f"{path} line {number}: looks like a YAML/TOML job file ({shown_value(line)}{others}) but is read as one "
            "prompt per line, as any file not named .yaml/.yml/.toml is; if it is a job file, name it .yaml (or "
            ".toml), if these are prompts, put such a line in quotes"
        )
    if not prompts:
        raise InputError(
            f"prompts file {path} has no prompts (only blank or # lines); add one prompt per line"
        )
    return prompts
