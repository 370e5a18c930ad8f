"""Two CPU processes that stay up for a pytest session and run the gloo tests' rank functions, one
call after another (the `two_ranks` fixture of tests/conftest.py).

Each sequence-parallel test used to spawn two fresh processes (`torch.multiprocessing.spawn`),
and each of those imported torch, diffusers and the test module again: ~4-5 s of CPU apiece, on
a machine with two cores. Here a pair is started once per pytest process and reused: a call is
`fn(rank, world, port, *args)` on both ranks, as `spawn(fn, (world, port, *args), nprocs=2)`
called it, on a fresh port (each call makes and destroys its own process group). A rank function
must undo what it patches (it runs in a process later calls share). A call that fails on either
rank, or outlasts TIMEOUT_S, raises with the ranks' tracebacks and ends the pair (a rank may be
stuck in a collective); the next call starts a new one.
"""

from __future__ import annotations

import multiprocessing
import queue
import socket
import time
import traceback
from collections.abc import Callable
from typing import Any

WORLD = 2
TIMEOUT_S = 300.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(rank: int, tasks: Any, results: Any) -> None:
    """A rank's loop: run each (fn, port, args) it is sent; None ends it."""
    import torch.distributed as dist

    while (task := tasks.get()) is not None:
        fn, port, args = task
        try:
            fn(rank, WORLD, port, *args)
        except BaseException:
            results.put((rank, traceback.format_exc()))
            return  # its process group may be half torn down: this pair ends here
        if dist.is_initialized():  # a function that left its group: the next call makes its own
            dist.destroy_process_group()
        results.put((rank, None))


class TwoRanks:
    def __init__(self) -> None:
        self._context = multiprocessing.get_context("spawn")
        self._processes: list[Any] = []

    def _start(self) -> None:
        self._tasks = [self._context.Queue() for _ in range(WORLD)]
        self._results = self._context.Queue()
        self._processes = [
            self._context.Process(target=_serve, args=(rank, self._tasks[rank], self._results), daemon=True)
            for rank in range(WORLD)
        ]
        for process in self._processes:
            process.start()

    def run(self, fn: Callable[..., Any], *args: Any) -> None:
        """fn(rank, WORLD, port, *args) on both ranks; returns when both have returned."""
        if not self._processes or not all(p.is_alive() for p in self._processes):
            self.close()
            self._start()
        port = free_port()
        for tasks in self._tasks:
            tasks.put((fn, port, args))
        done: set[int] = set()
        deadline = time.monotonic() + TIMEOUT_S
        while len(done) < WORLD:
            try:
                rank, error = self._results.get(timeout=1.0)
            except queue.Empty:
                dead = [r for r, p in enumerate(self._processes) if r not in done and not p.is_alive()]
                if dead or time.monotonic() > deadline:
                    codes = [p.exitcode for p in self._processes]
                    self.close()
                    why = f"rank(s) {dead} died (exit codes {codes})" if dead else f"no answer in {TIMEOUT_S:.0f} s"
                    raise RuntimeError(f"{fn.__qualname__} on {WORLD} ranks: {why}") from None
                continue
            if error is not None:
                self.close()
                raise RuntimeError(f"{fn.__qualname__} failed on rank {rank}:\n{error}")
            done.add(rank)

    def close(self) -> None:
        """End the pair (politely when idle; a stuck rank is killed)."""
        for process, tasks in zip(self._processes, getattr(self, "_tasks", []), strict=False):
            if process.is_alive():
                tasks.put(None)
        for process in self._processes:
            process.join(timeout=5)
            if process.is_alive():
                process.kill()
                process.join()
        self._processes = []
