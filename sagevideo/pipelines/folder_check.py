"""A model folder's files checked before any weights load: what would otherwise be a traceback
(exit 1) deep inside diffusers' or transformers' loaders after the batch started.

`folder_problems(path, index)` -> [(place, problem)], place being the file or folder relative to
the model folder ("transformer/config.json"), for each component `model_index.json` names:
- links: a symlink loop or a symlink to nothing, anywhere in the folder (the loaders and the
  fingerprint follow links, as a Hugging Face cache's snapshot is made of them);
- JSON: every .json file of a component parses (configs, tokenizer files, shard indexes);
- safetensors: every .safetensors file of a component opens with the `safetensors` library, which
  parses its header and checks that the tensors' byte ranges cover the file exactly (a truncated
  file, a corrupted header, dtype or offsets fail); a shard index
  (`*.safetensors.index.json`) names files that exist and hold the tensors it maps to them;
- config types: each config value has the type the component's class takes for it (the
  annotations, else the defaults, of the class's `__init__`: a diffusers class's own, a transformers
  model's `config_class`'s), e.g. `"num_layers": "two"` where an int is taken.
A flipped bit in a tensor's payload (not its header) changes no size or structure: nothing short
of a checksum sees it, and diffusers folders carry none.
"""

from __future__ import annotations

import collections.abc
import errno
import importlib
import inspect
import json
import os
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

INDEX_SUFFIX = ".safetensors.index.json"
COPY_AGAIN = "copy or download it again"


def folder_problems(path: Path, index: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(place, problem) for every broken file of the components `index` (model_index.json) names."""
    problems = _broken_links(path, path)
    for name, (library, class_name) in _components(index).items():
        folder = path / name
        if os.path.islink(folder) and any(place == name for place, _ in problems):
            continue  # a looped or dangling component link, said once
        if not folder.is_dir():
            continue  # a missing part: each family's own checks name it with what the part is
        if folder.is_symlink():  # os.walk does not enter linked folders: look inside this one too
            problems += [p for p in _broken_links(path, folder) if p not in problems]
        configs = _json_files(path, folder, problems)
        shards = _safetensors_files(path, folder, problems)
        problems += _index_problems(path, folder, configs, shards)
        problems += _config_type_problems(path, folder, configs, library, class_name)
    return problems


def _components(index: Mapping[str, Any]) -> dict[str, tuple[str, str]]:
    """{folder: (library, class name)} of the components model_index.json names ([null, null]: none)."""
    return {name: (spec[0], spec[1]) for name, spec in index.items()
            if not name.startswith("_") and isinstance(spec, list) and len(spec) == 2
            and all(isinstance(part, str) for part in spec)}


def _place(path: Path, file: Path) -> str:
    return file.relative_to(path).as_posix()


def _broken_links(path: Path, top: Path) -> list[tuple[str, str]]:
    """Symlinks under `top` that loop or point at nothing (linked folders are not entered)."""
    problems = []
    for root, dirs, files in os.walk(top):
        for entry in [*dirs, *files]:
            file = Path(root) / entry
            if not file.is_symlink():
                continue
            try:
                os.stat(file)
            except OSError as err:
                target = os.readlink(file)
                if err.errno == errno.ELOOP:
                    problems.append((_place(path, file), f"a symlink loop ({entry} -> {target}); point it at the "
                                                         "real file, or copy the file in its place"))
                else:
                    problems.append((_place(path, file), f"a symlink to {target}, which does not exist (an "
                                                         f"incomplete download or copy?); {COPY_AGAIN}"))
    return problems


def _readable(file: Path) -> bool:
    """A file whose link, if any, resolves (broken links are said by `_broken_links`)."""
    try:
        return file.is_file()
    except OSError:
        return False


def _json_files(path: Path, folder: Path, problems: list[tuple[str, str]]) -> dict[str, Any]:
    """{file name: parsed JSON} of the folder's readable .json files; unreadable ones added to problems."""
    parsed = {}
    for file in sorted(folder.glob("*.json")):
        if not _readable(file):
            continue
        try:
            parsed[file.name] = json.loads(file.read_text(encoding="utf-8"))
        except (OSError, ValueError) as err:
            problems.append((_place(path, file), f"not readable JSON ({err}); {COPY_AGAIN}"))
    return parsed


def _safetensors_files(path: Path, folder: Path, problems: list[tuple[str, str]]) -> dict[str, set[str]]:
    """{file name: its tensor names} of the folder's .safetensors files that open; the others added
    to problems. Only headers are read (safetensors memory-maps the file)."""
    from safetensors import safe_open

    keys = {}
    for file in sorted(folder.glob("*.safetensors")):
        if not _readable(file):
            continue
        try:
            with safe_open(str(file), framework="numpy") as opened:
                keys[file.name] = set(opened.keys())
        except Exception as err:  # safetensors' own error type, or OSError
            problems.append((_place(path, file), _safetensors_reason(err, file)))
    return keys


def _safetensors_reason(err: Exception, file: Path) -> str:
    """safetensors' error in words, with the file's size."""
    reason = str(err).removeprefix("Error while deserializing header: ")
    size = f"{file.stat().st_size:,} bytes"
    if "not fully covered" in reason or "header too small" in reason:
        return (f"truncated or incomplete ({size}, not what its header lists; safetensors: {reason}); "
                f"{COPY_AGAIN}")
    return f"not a readable safetensors file ({size}; its header is corrupt: {reason}); {COPY_AGAIN}"


def _index_problems(path: Path, folder: Path, configs: Mapping[str, Any],
                    shards: Mapping[str, set[str]]) -> list[tuple[str, str]]:
    """A shard index's files that are missing, and tensors it maps to a shard that lacks them."""
    problems = []
    for name, data in configs.items():
        if not name.endswith(INDEX_SUFFIX):
            continue
        place = _place(path, folder / name)
        weight_map = data.get("weight_map") if isinstance(data, dict) else None
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            problems.append((place, f"has no weight_map of tensor -> file names; {COPY_AGAIN}"))
            continue
        by_file: dict[str, list[str]] = {}
        for tensor, file in weight_map.items():
            by_file.setdefault(file, []).append(tensor)
        for file, tensors in by_file.items():
            if not (folder / file).exists() and not (folder / file).is_symlink():
                problems.append((place, f"names {file} ({_tensors(len(tensors))}), which is missing; copy the "
                                        "missing shard"))
            elif file in shards:
                absent = [t for t in tensors if t not in shards[file]]
                if absent:
                    problems.append((place, f"maps {_tensors(len(absent))} to {file}, which does not hold them "
                                            f"(e.g. {absent[0]!r}); the index and the shards are of different "
                                            "copies: copy them again"))
    return problems


def _tensors(count: int) -> str:
    return f"{count} tensor" + ("" if count == 1 else "s")


# --- config values against the types the component's class takes ------------------------------


def _config_type_problems(path: Path, folder: Path, configs: Mapping[str, Any], library: str,
                          class_name: str) -> list[tuple[str, str]]:
    """Values of the component's config whose type its class's `__init__` does not take."""
    found = _config_signature(library, class_name)
    if found is None:
        return []
    file_name, init = found
    config = configs.get(file_name)
    if not isinstance(config, dict):
        return [] if file_name not in configs else [(_place(path, folder / file_name),
                                                     f"is not a JSON object; {COPY_AGAIN}")]
    hints = _hints(init)
    parameters = inspect.signature(init).parameters
    problems = []
    for key, value in config.items():
        parameter = parameters.get(key)
        if key.startswith("_") or parameter is None or parameter.kind in _VARIADIC:
            continue
        if value is None and parameter.default is None:
            continue
        hint = hints.get(key)
        verdict = _fits(value, hint) if hint is not None else _fits_default(value, parameter.default)
        if verdict is False:
            shown = json.dumps(value)
            shown = shown if len(shown) <= 60 else shown[:57] + "..."
            takes = _describe(hint) if hint is not None else f"a {type(parameter.default).__name__}"
            default = "" if parameter.default is inspect.Parameter.empty else f", default {parameter.default!r}"
            problems.append((_place(path, folder / file_name), (
                f"{key} is {shown}, but {class_name} takes {takes} there{default}; correct the value, "
                f"or {COPY_AGAIN}")))
    return problems


def _config_signature(library: str, class_name: str) -> tuple[str, Any] | None:
    """(config file name, the __init__ its values are passed to) of a component class: a diffusers
    ConfigMixin's own (config.json, scheduler_config.json), a transformers model's config class's
    (config.json); None for classes without a config (tokenizers) or that cannot be imported here
    (the loader then says why)."""
    if library not in ("diffusers", "transformers") and not library.startswith("sagevideo."):
        return None  # only the libraries the loaders import themselves
    try:
        cls = getattr(importlib.import_module(library), class_name)
    except Exception:  # an unknown class or a missing optional dependency: the loader's to report
        return None
    config_class = getattr(cls, "config_class", None)
    if inspect.isclass(config_class):
        return "config.json", config_class.__init__
    name = getattr(cls, "config_name", None)
    return (name, cls.__init__) if isinstance(name, str) else None


def _hints(init: Any) -> dict[str, Any]:
    """{parameter: type hint} of `init`; one parameter at a time where a hint cannot be evaluated
    (transformers' `torch.dtype` in string annotations): those have none."""
    try:
        return typing.get_type_hints(init)
    except Exception:
        pass
    hints = {}
    namespace = getattr(inspect.unwrap(init), "__globals__", {})
    for name, parameter in inspect.signature(init).parameters.items():
        annotation = parameter.annotation
        if isinstance(annotation, str):
            try:
                annotation = eval(annotation, dict(namespace))  # noqa: S307 - the library's own annotation text
            except Exception:
                continue
        if annotation is not inspect.Parameter.empty:
            hints[name] = annotation
    return hints


_VARIADIC = (inspect.Parameter.VAR_KEYWORD, inspect.Parameter.VAR_POSITIONAL)
_SEQUENCES = (list, tuple, collections.abc.Sequence, collections.abc.Iterable)
_MAPPINGS = (dict, collections.abc.Mapping)


def _fits(value: Any, hint: Any) -> bool | None:
    """Whether a JSON value has the type `hint` asks for: True, False, or None where the hint says
    nothing checkable (Any, a class JSON cannot hold). Numbers are lenient as the libraries are
    (an int where a float is taken; a bool where diffusers annotates float: force_upcast)."""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin is typing.Annotated:
        return _fits(value, args[0])
    if origin in (typing.Union, types.UnionType):
        return _fits_one_of(value, args)
    if origin is typing.Literal:
        return any(type(value) is type(arg) for arg in args)
    if hint is type(None):
        return value is None
    base = origin or hint
    if base is bool:
        return isinstance(value, (bool, int))
    if base is int:  # not 2.0: range(2.0) and layer sizes refuse floats
        return isinstance(value, int)
    if base is float:
        return isinstance(value, (int, float))
    if base is str:
        return isinstance(value, str)
    if base in _MAPPINGS:
        return isinstance(value, dict)
    if base in _SEQUENCES:
        if not isinstance(value, list):
            return False
        items = [arg for arg in args if arg is not Ellipsis]  # tuple[int] in diffusers means any length
        return not items or False not in [_fits_one_of(item, items) for item in value]
    return None


def _fits_one_of(value: Any, hints: collections.abc.Sequence[Any]) -> bool | None:
    verdicts = [_fits(value, hint) for hint in hints]
    return True if True in verdicts else None if None in verdicts else False


def _fits_default(value: Any, default: Any) -> bool | None:
    """For a parameter without a hint: the kind of its default (None: anything)."""
    if default is None or default is inspect.Parameter.empty:
        return None
    if isinstance(default, bool):
        return isinstance(value, (bool, int))
    if isinstance(default, (int, float)):
        return isinstance(value, (int, float))
    if isinstance(default, str):
        return isinstance(value, str)
    if isinstance(default, (list, tuple)):
        return isinstance(value, list)
    if isinstance(default, dict):
        return isinstance(value, dict)
    return None


def _describe(hint: Any) -> str:
    """A type hint as the message shows it: 'int', 'int | None', 'tuple[int]'."""
    if inspect.isclass(hint) and typing.get_origin(hint) is None and not typing.get_args(hint):
        return hint.__name__
    return str(hint).replace("typing.", "").replace("NoneType", "None")
