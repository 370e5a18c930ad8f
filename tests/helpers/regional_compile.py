"""Regional torch.compile (each transformer block `.compile()`d, as diffusers' users do) with
sagevideo installed: shared by the family tests. Checks what issue 21 asks of the compiled path:
one graph per block class (no recompile per block, step or call), no graph break, outputs as
eager, and a backend record for every attention call of every forward."""

from __future__ import annotations

import torch

import sagevideo
from sagevideo.pipelines.forwards import build_step


def stock_graphs(step, compile_backend: str) -> int:
    """Graphs Dynamo makes for one step of the blocks compiled without sagevideo (a model's own
    recompiles, e.g. HunyuanVideo's first single block gets another stride than the others)."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    for block in step.blocks:
        block.compile(backend=compile_backend)
    step.run()
    step.run()
    graphs = counters["stats"]["unique_graphs"]
    for block in step.blocks:
        block._compiled_call_impl = None  # back to eager
    return graphs


def check_regional_compile(name: str, compile_backend: str, forwards: int = 3, exact: bool = True,
                           backend: str = "reference", device: str = "cpu", dtype=torch.float32) -> None:
    """Build tiny config `name`, run one step eagerly with sagevideo (`backend`), then compile each
    block and run `forwards` steps: assert no graph break, no graph beyond those of the stock model
    (no recompile per block or call), outputs as eager (bit for bit when `exact`), and as many
    records per step as eagerly."""
    from torch._dynamo.utils import counters

    step = build_step(name, device, dtype)
    stock = stock_graphs(step, compile_backend)
    with sagevideo.install(step.model, backend=backend), sagevideo.record_backends() as eager_log:
        eager = step.run()
    calls = sum(eager_log.counts.values())
    assert calls > 0

    torch._dynamo.reset()
    counters.clear()
    for block in step.blocks:
        block.compile(backend=compile_backend)
    graphs_after = []
    with sagevideo.install(step.model, backend=backend), sagevideo.record_backends() as log:
        for _ in range(forwards):
            outs = step.run()
            graphs_after.append(counters["stats"]["unique_graphs"])
            for got, want in zip(outs, eager, strict=True):
                if exact:
                    assert torch.equal(got, want)
                else:  # Inductor fuses differently: close in direction, not bit for bit
                    cosine = torch.nn.functional.cosine_similarity(got.double().flatten(), want.double().flatten(),
                                                                   dim=0)
                    assert cosine > 0.9999, cosine
    assert dict(counters["graph_break"]) == {}, dict(counters["graph_break"])
    assert graphs_after == [stock] * forwards, (graphs_after, stock)  # sagevideo adds no graph, ever
    assert log.counts == {label: n * forwards for label, n in eager_log.counts.items()}
    assert log.unrouted_reasons == []
