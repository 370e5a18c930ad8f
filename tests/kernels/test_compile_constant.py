"""`constant_under_compile` against torch's own `torch.compiler.assume_constant_result`."""

import subprocess
import sys

import pytest
import torch

from sagevideo.kernels.compile_constant import constant_under_compile


def test_it_sets_what_torchs_decorator_sets_and_nothing_else():
    def ours():
        return 1

    def torchs():
        return 1

    assert constant_under_compile(ours) is ours
    assert torch.compiler.assume_constant_result(torchs) is torchs
    assert vars(ours) == vars(torchs) != {}


def test_torch_compile_calls_a_marked_function_instead_of_tracing_it():
    """Traced into, the function's graph break fails fullgraph=True; called as a constant it does not."""
    from torch._dynamo.utils import counters

    calls = []

    @constant_under_compile
    def untraceable() -> float:
        calls.append(1)
        torch._dynamo.graph_break()
        return 2.0

    torch._dynamo.reset()
    counters.clear()
    out = torch.compile(lambda x: x * untraceable(), fullgraph=True, backend="eager")(torch.ones(3))
    assert out.tolist() == [2.0] * 3 and calls and dict(counters["graph_break"]) == {}
    torch._dynamo.reset()


@pytest.mark.slow  # a fresh interpreter importing torch
def test_planning_imports_no_dynamo():
    """What a batch's driver imports to plan (kernel plans, the sparse settings) leaves torch._dynamo
    out: about a second of every `sagevideo` process that never compiles."""
    code = ("import sys, sagevideo.kernels.plans, sagevideo.attention.sparse, sagevideo.attention.backends; "
            "print('torch._dynamo' in sys.modules)")
    imported = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert imported.strip() == "False"
