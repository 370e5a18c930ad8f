"""Bounds on what a hostile or broken input file can make sagevideo build or print.

- `alias_expansion(node)`: how many values a composed YAML document's aliases add once written
  out. PyYAML builds an alias as a second reference to one object, so a few hundred bytes of
  nested anchors ("billion laughs") load at once, and every later walk over the values (pydantic,
  an error's `repr`, the manifest's JSON) expands them: 9 levels of 9 aliases are 387 million
  strings. Job files are refused past `MAX_ALIAS_VALUES`, before anything is built from them.
- `shown(value)`: a value as an error message quotes it, cut to a few items and characters.
- `capped(lines)`: at most `MAX_PROBLEM_LINES` problem lines, then how many more there are.
"""

from __future__ import annotations

import reprlib
from typing import Any

# Values that aliases may add to one job file (a merge `<<: *common` into every one of 1,000 jobs
# adds ~11 values per job); the bomb above adds 387 million.
MAX_ALIAS_VALUES = 100_000
MAX_PROBLEM_LINES = 20


class AliasCycle(ValueError):
    """A YAML alias inside the node its anchor names (a value that contains itself)."""


def alias_expansion(root: Any) -> int:
    """Nodes that aliases add to a composed YAML document (`yaml.Node`): its node count with every
    alias written out, minus the nodes written in the file. Linear in the file's nodes (each node's
    expanded size is computed once); raises AliasCycle for a value that contains itself."""
    size: dict[int, int] = {}
    open_nodes: set[int] = set()  # the current path from the root: a child among them is a cycle
    stack: list[tuple[Any, bool]] = [(root, False)]
    while stack:  # iterative: a deep file must not meet Python's recursion limit here
        node, children_done = stack.pop()
        key = id(node)
        if children_done:
            open_nodes.discard(key)
            size[key] = 1 + sum(size[id(child)] for child in _children(node))
            continue
        if key in size:
            continue
        if key in open_nodes:
            raise AliasCycle(f"line {node.start_mark.line + 1}")
        open_nodes.add(key)
        stack.append((node, True))
        stack.extend((child, False) for child in _children(node) if id(child) not in size)
    return size[id(root)] - len(size)


def _children(node: Any) -> list[Any]:
    value = node.value
    if not isinstance(value, list):  # a scalar
        return []
    return [part for item in value for part in (item if isinstance(item, tuple) else (item,))]  # mapping pairs


_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxlist, _REPR.maxtuple, _REPR.maxdict = 2, 4, 4, 4
_REPR.maxstring, _REPR.maxother = 80, 80


def shown(value: Any) -> str:
    """`repr(value)` for an error message, cut to a few items per level and 80 characters per
    string ('...' marks a cut); reprlib never builds the whole repr of a huge value."""
    return _REPR.repr(value)


def capped(lines: list[str]) -> list[str]:
    """`lines`, or the first MAX_PROBLEM_LINES of them and one line saying how many more there are."""
    if len(lines) <= MAX_PROBLEM_LINES:
        return lines
    more = len(lines) - MAX_PROBLEM_LINES
    return [*lines[:MAX_PROBLEM_LINES], f"and {more} more problem(s) like these; fix the ones above and run again"]
