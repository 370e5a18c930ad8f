"""Block-sparse notes of an installed model, the same eagerly and under torch.compile (docs/sparse.md).

Compiled blocks share one graph across layers (routes carry their layer's text position, never its
name), and nothing in a call may read the device. So each layer's route (`routing.LayerRoute`) holds
- `sparse_stats`: float64 (4,) on the model's device, [sum of densities, sparse calls, least density,
  calls on reused lists],
  which each of its sparse calls adds to on the device (`attention.sparse.add_call`, through
  `sageattn`'s `_sparse_counter`, a graph input like the guard's counter);
- `dense_calls`: on the host, (reason, planned) -> calls that ran dense under the sparse plan. The
  reason is decided on the host (while tracing, in a compiled graph); a compiled call notes it with
  an effectful op (`sagevideo::note_dense_call`) that carries the route's key, an int64 0-dim CPU
  tensor (reading it syncs nothing, and as a graph input it keeps one graph for every layer).

`collect` reads the routes' statistics in one transfer at the end of each forward (the guard's forward
hook, outside compiled code) and notes them at the clock's step (`records.report_sparse`); in a
sequence-parallel job, over every rank's heads, with how unevenly the ranks were loaded (`over_ranks`).
A layer's n sparse calls of one forward become n notes with their mean and least density (one at the
least, the others at the mean of the rest), so that `BackendLog.sparse_summary` (per layer: calls, mean, least;
per step: mean) reads as if each call had been noted; dense calls are noted each with density 1.
"""

from __future__ import annotations

import itertools
import math
import weakref
from collections import Counter
from typing import Any

import torch

from sagevideo.attention.records import SparseNote, capturing, register_effect, report_sparse
from sagevideo.attention.sparse import SPARSE_CALLS, SPARSE_MIN, SPARSE_REUSED, SPARSE_SUM, empty_stats

RANK_SPREAD = 4  # the column `over_ranks` adds
_ROUTES: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()  # key -> LayerRoute
_KEYS = itertools.count()


def route_key(route: Any) -> torch.Tensor:
    """A new key for `route` (int64 0-dim, on the CPU), by which a compiled call's note finds it."""
    key = next(_KEYS)
    _ROUTES[key] = route
    return torch.tensor(key, dtype=torch.int64)


def note_dense(route: Any, reason: str, planned: bool) -> None:
    """Note one call of `route` that ran dense under a sparse plan: `planned` (its plan made it sparse)
    with the `reason` it could not be, else a step or layer the plan keeps dense (reason '')."""
    if torch.compiler.is_compiling():
        torch.ops.sagevideo.note_dense_call(route.sparse_key, reason, planned)
    else:
        route.dense_calls[(reason, planned)] += 1


@torch.library.custom_op("sagevideo::note_dense_call", mutates_args=())
def _note_dense_call_op(key: torch.Tensor, reason: str, planned: bool) -> None:
    # Runs each time the compiled graph does; the key is a CPU tensor, so reading it waits for nothing.
    route = _ROUTES.get(int(key))
    if route is not None:
        route.dense_calls[(reason, planned)] += 1


@_note_dense_call_op.register_fake
def _(key: torch.Tensor, reason: str, planned: bool) -> None:
    return None


register_effect("note_dense_call")


def collect(routes: list[Any], step: int | None) -> None:
    """Note the calls `routes` made since the last collection (one device-to-host transfer for their
    statistics) at denoising `step`, and start their statistics afresh. Outside compiled code; not
    while a CUDA graph is being captured (no host read then: the statistics keep adding up on the
    device, each replay's too, and the next collection outside the capture notes them)."""
    if not routes or capturing():
        return
    device = routes[0].sparse_stats.device
    rows = over_ranks(torch.stack([route.sparse_stats.to(device) for route in routes])).tolist()
    for route, row in zip(routes, rows, strict=True):
        spread = None if math.isnan(row[RANK_SPREAD]) else row[RANK_SPREAD]
        calls = int(row[SPARSE_CALLS])
        if calls:
            route.sparse_stats.copy_(_empty_on(route.sparse_stats.device))
            reused = int(row[SPARSE_REUSED])
            for index, density in enumerate(_densities(row[SPARSE_SUM], calls, row[SPARSE_MIN])):
                report_sparse(SparseNote(route.name, step, density, planned=True, reused=index < reused,
                                         rank_spread=spread))
        dense: Counter = route.dense_calls
        for (reason, planned), count in dense.items():
            for _ in range(count):
                report_sparse(SparseNote(route.name, step, 1.0, reason, planned=planned))
        dense.clear()


def over_ranks(stats: torch.Tensor) -> torch.Tensor:
    """Layers' statistics (float64 (layers, 4), `sparse_stats` rows) over every rank of a sequence-parallel
    job, the same on each rank, with a fifth column (`RANK_SPREAD`): each layer's most loaded rank's
    density sum over the ranks' mean (1 = balanced; NaN in one process, where the statistics are as
    they were). One tensor, so that `collect` still reads everything in one transfer.
    Under Ulysses each rank attends to an equal share of every layer's heads over the whole sequence, so
    a call's density over all heads is the mean of the ranks' (the sums are averaged), and the least is
    the least any rank's share reached (a lower bound of the calls' least); calls and calls on reused
    lists are the same on every rank. Every rank collects at the same points (they run the same forwards
    and calls in step), so the reductions (`parallel.launch.reduce_over_ranks`) pair up."""
    from sagevideo.parallel.launch import job_size, reduce_over_ranks

    world = job_size()
    if world == 1:
        return torch.cat([stats, torch.full_like(stats[:, :1], math.nan)], dim=1)
    summed = reduce_over_ranks(stats[:, SPARSE_SUM], "sum") / world
    most = reduce_over_ranks(stats[:, SPARSE_SUM], "max")
    least = reduce_over_ranks(stats[:, SPARSE_MIN], "min")
    spread = torch.where(summed > 0, most / summed.clamp(min=1e-30), 1.0)
    stats = torch.cat([stats, spread[:, None]], dim=1)
    stats[:, SPARSE_SUM], stats[:, SPARSE_MIN] = summed, least
    return stats


def _densities(total: float, calls: int, least: float) -> list[float]:
    """`calls` densities whose sum is `total` and least `least`."""
    if calls == 1:
        return [total]
    rest = (total - least) / (calls - 1)
    return [least] + [max(rest, least)] * (calls - 1)


_EMPTY: dict[torch.device, torch.Tensor] = {}


def _empty_on(device: torch.device) -> torch.Tensor:
    """`empty_stats` on `device`, made once (a reset is then one device copy, no host transfer)."""
    empty = _EMPTY.get(device)
    if empty is None:
        empty = _EMPTY[device] = empty_stats(device)
    return empty
