"""Job files: YAML, TOML or plain text (one prompt per line) -> jobs that know their lines.

YAML (TOML is the same with `[recipe]` and `[defaults]` tables and `[[jobs]]` tables):

    recipe:                   # the batch's speed recipe (optional; docs/recipe.md)
      compile: regional
      cache: first-block
    defaults:                 # fields every job gets unless it sets its own (optional)
      steps: 50
      resolution: 720x480     # WIDTHxHEIGHT, or height: / width:
    jobs:
      - prompt: a red panda eating bamboo, cinematic lighting
        output: shot-010      # -> shot-010.mp4 (a plain file name; refused, not rewritten, if unsafe)
        seed: 3
      - prompt: the camera pulls back from the lighthouse
        image: stills/lighthouse.png  # image-to-video models: the first frame to start from
      - a bare string is a job with just a prompt

Job fields are `sagevideo.jobs.specs.JobSpec`'s: prompt, negative_prompt, seed, frames, resolution (or
height/width), steps, guidance, attention (sage/full), pv (fp16/fp8), plan, sparse (block-sparse
attention, `--sparse`'s text: dynamic:0.15, static:0.25 or off), image, name, output. A
YAML file may also be a bare list of jobs. Relative `plan` and `image` paths are relative to the job
file's folder.
Any other extension is read as plain text: one prompt per line, blank lines and '#' lines skipped;
such a file with lines only a job file has (`defaults: {steps: 2}`, `jobs:`, `[[jobs]]`, `- prompt: a`)
is refused, not made into one video per line (`sagevideo.jobs.text_files.read_prompts_file`).

`recipe:` holds the `sagevideo.jobs.recipe.Recipe` settings (compile, compile_backend, linear,
linear_keep (a pattern or a list of them), cache, cache_threshold; dashes or underscores). The
recipe is batch-wide (applied once per loaded pipeline, part of the job id), so a recipe setting in
`defaults:` or in a job is refused with where to put it. A setting of the file applies where the
command line or the Python API leaves that option at its default; both giving different values is
an error naming both places (`sagevideo.generation.plan.plan_batch` merges them, `layer_recipe`).

Every problem in the file is reported at once, before anything is loaded, as
'FILE line N (job K): field: what is wrong (got value)' ('(defaults)', '(recipe)' for those
sections), raised as `InputError`: a bad default or recipe setting is reported once at its line
and left out, so it hides no job's own problems.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from sagevideo.errors import InputError
from sagevideo.jobs.bounds import MAX_ALIAS_VALUES, AliasCycle, alias_expansion
from sagevideo.jobs.problems import group_problems, problem_parts, where
from sagevideo.jobs.recipe import RECIPE_FIELDS, Recipe
from sagevideo.jobs.specs import JobSpec, job_problems, merge_fields
from sagevideo.jobs.text_files import read_prompts_file, read_text_file

STRUCTURED = {".yaml": "yaml", ".yml": "yaml", ".toml": "toml"}
TOP_LEVEL = ("recipe", "defaults", "jobs")
# In `defaults`, these would give every job the same prompt or the same output file.
PER_JOB_ONLY = ("prompt", "output")
_SIZE_FIELDS = ("height", "width")
# File paths a job may give: relative ones are relative to the job file.
PATH_FIELDS = ("plan", "image")


@dataclass(frozen=True)
class Origin:
    """Where one job of a job file came from, for error messages.

    job: 1-based job number. line: first line of the job (None where the format gives none).
    lines: field -> line of that field in the job; inherited: field -> line in `defaults`.
    """

    file: str
    job: int
    line: int | None
    lines: Mapping[str, int] = field(default_factory=dict)
    inherited: Mapping[str, int] = field(default_factory=dict)

    def at(self, name: str | None = None) -> str:
        """'FILE line N (job K)' for a field set in the job, 'FILE line N (defaults)' for an inherited one."""
        if name in self.lines:
            return _place(self.file, self.lines[name], f"job {self.job}")
        if name in self.inherited:
            return _place(self.file, self.inherited[name], "defaults")
        return _place(self.file, self.line, f"job {self.job}")

    def __str__(self) -> str:
        return self.at()


@dataclass(frozen=True)
class FileRecipe:
    """A job file's `recipe:` section. fields: the settings it gives with a good value (field name
    with underscores -> validated value); lines: field -> its line; bad: fields given a bad value
    (reported in `JobFile.problems`, left out of `fields`); line: the section's line."""

    file: str
    line: int | None
    fields: Mapping[str, Any] = field(default_factory=dict)
    lines: Mapping[str, int] = field(default_factory=dict)
    bad: frozenset[str] = frozenset()

    def at(self, name: str | None = None) -> str:
        """'FILE line N (recipe)': the line of setting `name`, else the section's."""
        return _place(self.file, self.lines.get(name, self.line) if name else self.line, "recipe")


@dataclass
class JobFile:
    """A read job file. items: (job dict or prompt, Origin or 'FILE line N' label), in file order.

    problems: (where, what is wrong) found in its layout, recipe and defaults; the jobs' own fields
    are checked when they are parsed (`sagevideo.jobs.specs.collect_jobs`), with the other settings.
    recipe: its `recipe:` section, None when it has none."""

    path: Path
    kind: str  # "yaml", "toml" or "text"
    items: list[tuple[Any, Any]]
    problems: list[tuple[str, str]] = field(default_factory=list)
    recipe: FileRecipe | None = None


def job_file_kind(path: str | Path) -> str:
    """"yaml", "toml" or "text", from the file name's extension."""
    return STRUCTURED.get(Path(path).suffix.lower(), "text")


def looks_like_job_file(value: Any) -> bool:
    """True when a `generate()` argument names a job file rather than being a prompt.

    A Path always does; a string does when it is one word ending in .yaml/.yml/.toml/.txt (a
    prompt is text with spaces), so a mistyped file name gives 'does not exist', not a video.
    """
    if isinstance(value, Path):
        return True
    return (
        isinstance(value, str)
        and not any(c.isspace() for c in value.strip())
        and Path(value.strip()).suffix.lower() in (*STRUCTURED, ".txt")
    )


def read_job_file(path: str | Path) -> JobFile:
    """Read and check a job file's structure, defaults and jobs' fields; raises InputError naming
    each bad line (all of them at once)."""
    job_file = load_job_file(path)
    problems = list(job_file.problems)
    for value, label in job_file.items:
        problems += [(where(label, fld), line) for fld, line in job_problems(value, {})[1]]
    if problems:
        raise InputError(group_problems(problems))
    return job_file


def load_job_file(path: str | Path) -> JobFile:
    """Read a job file, collecting the problems of its layout and defaults in `JobFile.problems`
    instead of raising; raises InputError only when the file cannot be read or parsed at all."""
    path = Path(path)
    kind = job_file_kind(path)
    if kind == "text":  # read_prompts_file refuses a job file under another extension
        return JobFile(path, kind, list(read_prompts_file(path)))
    text = read_text_file(path, "job file", "a YAML or TOML job file")
    data, lines = _parse_yaml(path, text) if kind == "yaml" else _parse_toml(path, text)
    items, problems = _jobs(path, data, lines)
    recipe = None
    if isinstance(data, dict) and "recipe" in data:
        recipe, found = _recipe(path, data["recipe"], lines)
        problems = found + problems  # in file order: the recipe section comes first
    return JobFile(path, kind, items, problems, recipe)


def fields_set_in(path: str | Path, names: tuple[str, ...]) -> list[str]:
    """Where a YAML/TOML job file sets any of `names` ('defaults.NAME', 'job K: NAME'), for the commands
    that set those fields themselves (`sagevideo ab`: attention, pv, plan per arm). A plain-text file
    sets none; a file that cannot be read or parsed gives [] (planning it reports why, with lines)."""
    path = Path(path)
    kind = job_file_kind(path)
    if kind == "text":
        return []
    if kind == "toml":
        _toml_module()  # a missing TOML reader is said, not taken for an unreadable file
    try:
        text = read_text_file(path, "job file", "a YAML or TOML job file")
        data = (_parse_yaml if kind == "yaml" else _parse_toml)(path, text)[0]
    except InputError:
        return []
    found = []
    if isinstance(data, dict):
        defaults = data.get("defaults")
        if isinstance(defaults, dict):
            found += [f"defaults.{name}" for name in names if name in defaults]
        jobs = data.get("jobs")
    else:
        jobs = data
    for number, job in enumerate(jobs if isinstance(jobs, list) else [], start=1):
        if isinstance(job, dict):
            found += [f"job {number}: {name}" for name in names if name in job]
    return found


def _place(file: str, line: int | None, what: str) -> str:
    return f"{file} line {line} ({what})" if line else f"{file} ({what})"


# --- structure -----------------------------------------------------------------------------------


def _jobs(path: Path, data: Any, lines: dict[tuple, int]) -> tuple[list[tuple[Any, Any]], list[tuple[str, str]]]:
    """Top-level checks, then defaults, then one (job dict, Origin) per job; every problem found
    is returned with the items that could be read, none stops the others from being checked."""
    name = str(path)
    if data is None:
        data = {}
    if isinstance(data, list):  # a bare list of jobs (YAML)
        data, lines = {"jobs": data}, {("jobs", *key): line for key, line in lines.items()}
    if not isinstance(data, dict):
        return [], [(name,
                     f"expected 'recipe', 'defaults' and 'jobs' sections (or a list of jobs), got a {_kind_of(data)}; "
                     "see `sagevideo generate --help` for the layout")]
    problems = []
    for key in data:
        if key not in TOP_LEVEL:
            at = _place(name, lines.get((key,)), "top level")
            if isinstance(key, str) and _recipe_field(key):
                problems.append((at, f"{key}: {_MISPLACED_RECIPE}"))
                continue
            close = difflib.get_close_matches(str(key), TOP_LEVEL, n=1, cutoff=0.5)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            problems.append((at, f"{key!r}: unknown section; use 'recipe', 'defaults' and 'jobs'{hint}"))
    defaults, found = _defaults(path, data.get("defaults"), lines)
    problems += found
    jobs = data.get("jobs")
    jobs_at = _place(name, lines.get(("jobs",)), "jobs")
    if jobs is None:
        problems.append(
            (name, "no 'jobs' list; add jobs: with at least one job (a prompt, or prompt: ... and other fields)")
        )
    elif not isinstance(jobs, list):
        problems.append((jobs_at, f"'jobs' must be a list of jobs, got a {_kind_of(jobs)}"))
    elif not jobs:
        problems.append((jobs_at, "'jobs' is empty; add at least one job"))
    if not isinstance(jobs, list):
        return [], problems

    inherited = _field_lines(lines, ("defaults",), defaults)
    items = []
    for number, job in enumerate(jobs, start=1):
        key = ("jobs", number - 1)
        origin = Origin(name, number, lines.get(key), _field_lines(lines, key, job), inherited)
        if isinstance(job, str):
            job = {"prompt": job}
        if not isinstance(job, dict):
            problems.append((origin.at(), f"a job must be a prompt or a table of fields, got a {_kind_of(job)}"))
            continue
        bad_keys = [k for k in job if not isinstance(k, str)]
        if bad_keys:
            problems.append((origin.at(), f"{bad_keys[0]!r} is not a field name; quote it or remove it"))
            continue
        misplaced = [k for k in job if _recipe_field(k)]
        problems += [(origin.at(k), f"{k}: {_MISPLACED_RECIPE}") for k in misplaced]
        job = {k: v for k, v in job.items() if k not in misplaced}  # said once; the job's other fields are checked
        items.append((merge_fields(defaults, _resolve_paths(path, job)), origin))
    return items, problems


def _defaults(path: Path, defaults: Any, lines: dict[tuple, int]) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """(the usable defaults, problems): each bad default is reported once, at its line, and left
    out, so the jobs are still checked (with what is left)."""
    name = str(path)
    if defaults is None:
        return {}, []
    at = _place(name, lines.get(("defaults",)), "defaults")
    if not isinstance(defaults, dict):
        return {}, [(at, f"'defaults' must be a table of job fields, got a {_kind_of(defaults)}")]
    problems, usable = [], {}
    for key, value in defaults.items():
        if not isinstance(key, str):
            problems.append((at, f"{key!r} is not a field name; quote it or remove it"))
        elif _recipe_field(key):
            problems.append((_place(name, lines.get(("defaults", key)), "defaults"), f"{key}: {_MISPLACED_RECIPE}"))
        elif key in PER_JOB_ONLY:
            problems.append(
                (_place(name, lines.get(("defaults", key)), "defaults"),
                 f"{key}: cannot be a default (every job would get the same {key}); set it on each job")
            )
        else:
            usable[key] = value
    _, found = job_problems({"prompt": "-", **usable}, {})  # the prompt is a stand-in: defaults have none
    bad = set()
    for fld, line in found:
        fld = (fld or "value").split(".", 1)[0]
        key = "resolution" if fld in _SIZE_FIELDS and "resolution" in usable else fld
        bad.add(key)
        if key == "resolution":
            bad.update(_SIZE_FIELDS)  # "resolution or height/width, not both": neither is trusted
        problems.append((_place(name, lines.get(("defaults", key), lines.get(("defaults",))), "defaults"), line))
    usable = {k: v for k, v in usable.items() if k not in bad}
    return _resolve_paths(path, usable), problems


# A recipe setting anywhere but `recipe:`: one recipe serves the whole batch (one loaded pipeline).
_MISPLACED_RECIPE = ("a recipe setting, which applies to the whole batch (once per loaded model, part of every "
                     "job's id); put it in the file's top-level recipe: section ([recipe] in TOML)")


def _recipe_field(key: Any) -> str | None:
    """The Recipe field a key names (dashes or underscores, as `parse_recipe` reads them), or None."""
    name = key.replace("-", "_") if isinstance(key, str) else None
    return name if name in RECIPE_FIELDS else None


def _recipe(path: Path, section: Any, lines: dict[tuple, int]) -> tuple[FileRecipe, list[tuple[str, str]]]:
    """The `recipe:` section and its problems, each at its line: a setting with a bad value is
    reported and left out (the others still apply and are checked)."""
    name = str(path)
    line = lines.get(("recipe",))
    at = _place(name, line, "recipe")
    if section is None:  # `recipe:` with nothing under it
        return FileRecipe(name, line), []
    if not isinstance(section, dict):
        settings = ", ".join(RECIPE_FIELDS)
        return FileRecipe(name, line), [(at, f"'recipe' must be a table of settings ({settings}), "
                                             f"got a {_kind_of(section)}")]
    problems: list[tuple[str, str]] = []
    fields: dict[str, Any] = {}
    field_lines: dict[str, int] = {}
    keys: dict[str, str] = {}  # field -> the key that gave it
    bad: set[str] = set()
    for key, value in section.items():
        key_at = _place(name, lines.get(("recipe", key), line), "recipe")
        field_name = _recipe_field(key)
        if field_name is None:
            problems.append((key_at, _not_a_recipe_setting(key)))
            continue
        if field_name in keys:
            problems.append((key_at, f"{key}: given twice (also as {keys[field_name]}); keep one"))
            continue
        keys[field_name] = key
        try:
            fields[field_name] = getattr(Recipe(**{field_name: value}), field_name)
        except ValidationError as err:
            bad.add(field_name)
            for loc, msg, shown in problem_parts(err):
                problems.append((key_at, f"{key}{loc.removeprefix(field_name)}: {msg}{shown}"))
            continue
        if ("recipe", key) in lines:
            field_lines[field_name] = lines[("recipe", key)]
    return FileRecipe(name, line, fields, field_lines, frozenset(bad)), problems


def _not_a_recipe_setting(key: Any) -> str:
    if not isinstance(key, str):
        return f"{key!r} is not a setting name; quote it or remove it"
    if key in JobSpec.model_fields or key == "resolution":
        return f"{key}: a job field, not a recipe setting; put it under defaults: (every job) or on a job"
    close = difflib.get_close_matches(key.replace("-", "_"), RECIPE_FIELDS, n=1, cutoff=0.6)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"{key}: unknown recipe setting; use {', '.join(RECIPE_FIELDS)}{hint}"


def _resolve_paths(path: Path, fields: dict[str, Any]) -> dict[str, Any]:
    """Relative plan and image paths are relative to the job file, not to wherever the command runs."""
    fields = dict(fields)
    for name in PATH_FIELDS:
        value = fields.get(name)
        if isinstance(value, str) and value.strip() and not Path(value).expanduser().is_absolute():
            fields[name] = str((path.parent / value).resolve())
    return fields


def _field_lines(lines: dict[tuple, int], prefix: tuple, fields: Any) -> dict[str, int]:
    """field -> line for the keys of one table; resolution also answers for height and width."""
    if not isinstance(fields, dict):
        return {}
    found = {k: lines[(*prefix, k)] for k in fields if isinstance(k, str) and (*prefix, k) in lines}
    if "resolution" in found:
        for key in _SIZE_FIELDS:
            found.setdefault(key, found["resolution"])
    return found


def _kind_of(value: Any) -> str:
    names = {dict: "table", list: "list", str: "string", type(None): "empty value"}
    return names.get(type(value), type(value).__name__)


# --- YAML ----------------------------------------------------------------------------------------


def _parse_yaml(path: Path, text: str) -> tuple[Any, dict[tuple, int]]:
    """(data, lines: key path -> 1-based line). Safe loader only: no Python objects from tags."""
    import yaml

    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        lines: dict[tuple, int] = {}
        if node is not None:
            _check_aliases(path, node)  # before anything is built from the nodes
            _walk_yaml(path, node, (), lines)
        data = loader.construct_document(node) if node is not None else None
    except RecursionError:  # PyYAML composes nested values recursively
        raise InputError(f"{path}: YAML values nested too deeply to read; a job file needs a few levels") from None
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        where = f"{path} line {mark.line + 1}, column {mark.column + 1}" if mark else str(path)
        what = " ".join(part for part in (err.context, err.problem) if part)
        if isinstance(err, yaml.constructor.ConstructorError):  # e.g. !!python/object: never built
            raise InputError(f"{where}: YAML tag not allowed: {what}; job files hold plain values only") from None
        raise InputError(
            f"{where}: YAML syntax error: {what}; check the indentation, and quote text that "
            "contains ': ' or starts with a special character ([ { & * ! | > ' \" % @ `)"
        ) from None
    except yaml.YAMLError as err:
        raise InputError(f"{path}: YAML syntax error: {err}") from None
    finally:
        loader.dispose()
    return data, lines


def _check_aliases(path: Path, node: Any) -> None:
    """Refuse a document whose aliases would expand past `MAX_ALIAS_VALUES` (an alias bomb) or into
    a value that contains itself: everything later walks the values written out."""
    try:
        added = alias_expansion(node)
    except AliasCycle as err:
        raise InputError(f"{path} {err}: a YAML alias (*name) inside the value its anchor (&name) names, a "
                         "value that contains itself; write the value out") from None
    if added > MAX_ALIAS_VALUES:
        raise InputError(
            f"{path}: its YAML aliases (*name) expand to {added:,} more values, past the {MAX_ALIAS_VALUES:,} a job "
            "file may add that way (an alias bomb?); write the values out, or give shared fields once under defaults:"
        )


def _walk_yaml(path: Path, node: Any, prefix: tuple, lines: dict[tuple, int]) -> None:
    """Record each key's and list item's line; refuse duplicate keys (PyYAML keeps the last silently)."""
    import yaml

    if len(prefix) > 3:  # deeper than jobs[i].field: nothing there is reported by line
        return
    if isinstance(node, yaml.MappingNode):
        seen: dict[Any, int] = {}
        for key_node, value_node in node.value:
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else None
            line = key_node.start_mark.line + 1
            if key in seen:
                raise InputError(
                    f"{path} line {line}: {key!r} appears twice in the same table (first on line {seen[key]}); keep one"
                )
            seen[key] = line
            lines[(*prefix, key)] = line
            _walk_yaml(path, value_node, (*prefix, key), lines)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            lines[(*prefix, index)] = item.start_mark.line + 1
            _walk_yaml(path, item, (*prefix, index), lines)


# --- TOML ----------------------------------------------------------------------------------------

_TOML_HEADER = re.compile(r"\s*(\[\[?)\s*([A-Za-z0-9_.\"' -]+?)\s*\]\]?\s*(#.*)?$")
_TOML_KEY = re.compile(r"\s*([A-Za-z0-9_-]+|\"[^\"]*\"|'[^']*')\s*=")


def _parse_toml(path: Path, text: str) -> tuple[Any, dict[tuple, int]]:
    """(data, lines). tomllib gives no positions, so lines come from a scan for table headers
    ([recipe], [defaults], [[jobs]]) and `key =` lines; inline tables simply get no line numbers."""
    tomllib = _toml_module()
    try:
        data = tomllib.loads(text)
    except RecursionError:  # tomllib parses nested arrays and tables recursively
        raise InputError(f"{path}: TOML values nested too deeply to read; a job file needs a few levels") from None
    except tomllib.TOMLDecodeError as err:
        message = str(err)
        found = re.search(r"\(at line (\d+), column (\d+)\)", message)
        where = f"{path} line {found[1]}, column {found[2]}" if found else str(path)
        message = re.sub(r"\s*\(at line \d+, column \d+\)", "", message)
        raise InputError(
            f"{where}: TOML syntax error: {message}; check that text is quoted and each key has '= value'"
        ) from None
    return data, _toml_lines(text)


def _toml_module() -> Any:
    """tomllib (Python 3.11+), else tomli, its backport (a dependency on 3.10); InputError when neither
    is installed, so a TOML job file is never silently passed over."""
    try:
        import tomllib
    except ModuleNotFoundError:
        try:
            import tomli as tomllib
        except ModuleNotFoundError:
            raise InputError(
                "reading a TOML job file needs tomllib (Python 3.11+) or tomli: pip install tomli, or write the "
                "job file as YAML"
            ) from None
    return tomllib


def _toml_lines(text: str) -> dict[tuple, int]:
    lines: dict[tuple, int] = {}
    section: tuple = ()
    jobs = -1
    for number, line in enumerate(text.splitlines(), start=1):
        header = _TOML_HEADER.match(line)
        if header and not _TOML_KEY.match(line):
            name = header[2].strip().strip("\"'")
            if header[1] == "[[" and name == "jobs":
                jobs += 1
                section = ("jobs", jobs)
                lines.setdefault(("jobs",), number)
            else:
                section = (name,)
            lines.setdefault(section, number)
            continue
        key = _TOML_KEY.match(line)
        if key:  # first occurrence wins: a later 'x =' inside a multi-line string is not a key
            lines.setdefault((*section, key[1].strip("\"'")), number)
    return lines
