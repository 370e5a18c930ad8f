"""`pipelines.sparse_notes`: what the end-of-forward collection notes, here over the ranks of a
sequence-parallel job (tests/pipelines/test_sparse.py covers one process: eager, compiled, CUDA graphs)."""

from __future__ import annotations

import json
import os
from collections import Counter
from types import SimpleNamespace

import pytest
import torch

# per rank: layer -> the densities of its calls in one forward (each rank attends to half the heads)
RANK_CALLS = [{"a": [0.2], "b": [0.2, 0.6]}, {"a": [0.4], "b": [0.5, 0.5]}]


def _route(name: str, densities: list[float]) -> SimpleNamespace:
    from sagevideo.attention.sparse import add_call, empty_stats

    stats = empty_stats()
    for density in densities:
        add_call(stats, torch.tensor(density, dtype=torch.float64))
    return SimpleNamespace(name=name, sparse_stats=stats, dense_calls=Counter())


def _noting_rank(rank, world, port, out_dir):
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import sagevideo
    from sagevideo.parallel.launch import init_from_env
    from sagevideo.pipelines.sparse_notes import collect

    init_from_env("gloo")
    routes = [_route(name, densities) for name, densities in RANK_CALLS[rank].items()]
    with sagevideo.record_backends() as log:
        collect(routes, step=3)
    notes = [(n.layer, n.step, round(n.density, 9), round(n.rank_spread, 6)) for n in log.sparse]
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump({"notes": notes, "summary": log.summary()["sparse"]["layers"]}, f)
    torch.distributed.destroy_process_group()


@pytest.mark.slow  # two processes (gloo)
def test_a_sequence_parallel_job_notes_each_layer_over_every_ranks_heads(tmp_path, two_ranks):
    """Under Ulysses each rank attends to half of every layer's heads: both ranks note a call's density
    over all heads, the mean of theirs (layer a: 0.2 and 0.4 -> 0.3; layer b's two calls: sums 0.8 and
    1.0 -> mean 0.45 a call), and as its least the least either rank reached (0.2), not rank 0's alone
    (what the manifest, which rank 0 writes, used to show); and how unevenly the ranks were loaded, the
    most loaded rank's sum over the mean (a: 0.4 / 0.3, b: 1.0 / 0.9)."""
    two_ranks(_noting_rank, str(tmp_path))
    noted = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    assert noted[0] == noted[1]
    assert noted[0]["notes"] == [["a", 3, 0.3, 1.333333], ["b", 3, 0.2, 1.111111], ["b", 3, 0.7, 1.111111]]
    layers = noted[0]["summary"]
    assert (layers["a"]["rank_spread"], layers["b"]["rank_spread"]) == (1.3333, 1.1111)


def test_one_process_notes_its_own_calls():
    import sagevideo
    from sagevideo.pipelines.sparse_notes import collect

    routes = [_route(name, densities) for name, densities in RANK_CALLS[0].items()]
    with sagevideo.record_backends() as log:
        collect(routes, step=0)
    assert [(n.layer, round(n.density, 9)) for n in log.sparse] == [("a", 0.2), ("b", 0.2), ("b", 0.6)]
    assert all(n.rank_spread is None for n in log.sparse)
    assert "rank_spread" not in log.summary()["sparse"]["layers"]["a"]
    assert all(int(r.sparse_stats[1]) == 0 for r in routes)  # started afresh
