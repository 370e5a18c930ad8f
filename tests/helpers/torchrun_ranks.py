"""`sagevideo.generation.torchrun` on the two processes of the `two_ranks` fixture, as torchrun would
start it on each rank: the path a batch over several ranks takes inside a rank (every job planned
and checked, one `ShardedHost` per rank with the family's Ulysses processors, rank 0 alone
decoding and writing through `run_batch`), the same on Ray (`scheduling.group.RankWorker` keeps a
`ShardedHost` too). The families' sequence-parallel batch tests use it; starting processes is tested
once per launcher: torchrun's in tests/generation/test_torchrun.py, a Ray group's in
tests/scheduling/test_group.py. `as_torchrun` runs any such entry (a script's `main(argv)`) the same way.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _rank(rank: int, world: int, port: int, main: Callable[[list[str]], int], argv: list[str], logs: str) -> None:
    from sagevideo.scheduling.group import torchrun_env

    env = torchrun_env(rank, [{"ip": "127.0.0.1", "port": port}, *({} for _ in range(world - 1))])
    before = {name: os.environ.get(name) for name in env}
    stdout, stderr = io.StringIO(), io.StringIO()
    os.environ.update(env)
    try:
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            code = main(argv)
    finally:  # the process serves later calls
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    result = {"code": code, "stdout": stdout.getvalue(), "stderr": stderr.getvalue()}
    (Path(logs) / f"rank{rank}.json").write_text(json.dumps(result))


def as_torchrun(two_ranks: Any, main: Callable[[list[str]], int], argv: list[str], logs: Path) -> list[dict[str, Any]]:
    """Each rank's {"code", "stdout", "stderr"} of `main(argv)` (a module-level function) run on both
    ranks of `two_ranks` (the fixture's run function) with the variables torchrun sets; `logs` is a
    folder for them."""
    logs.mkdir(parents=True, exist_ok=True)
    two_ranks(_rank, main, list(argv), str(logs))
    return [json.loads((logs / f"rank{rank}.json").read_text()) for rank in range(2)]


def torchrun_on_two_ranks(two_ranks: Any, argv: list[str], logs: Path) -> list[dict[str, Any]]:
    """`as_torchrun` of `sagevideo.generation.torchrun.main`: a batch over the two ranks."""
    from sagevideo.generation import torchrun

    return as_torchrun(two_ranks, torchrun.main, argv, logs)
