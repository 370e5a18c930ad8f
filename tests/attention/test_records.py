"""Backend records (`attention/records.py`) and the run-time guard's counts of direct calls: a call
past INT8's accuracy outside an installed model is flagged in its record (`last_backend()`,
`record_backends()`) and warned about by the next call or the end of the block, never inside it;
also from a torch.compile'd function."""

import warnings

import pytest
import torch

from sagevideo import last_backend, record_backends, sageattn
from sagevideo.attention import records


@pytest.fixture(autouse=True)
def _fresh_warnings():
    """Each kind of direct call warns once a process: each test starts from none warned."""
    records._peaky_warned.clear()
    yield
    records._peaky_warned.clear()


def _qkv(factor=1.0, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, 2, 256, 64, generator=gen) for _ in range(3))
    return q * factor, k * factor, v


def test_an_ordinary_call_counts_nothing_and_sdpa_has_no_count():
    sageattn(*_qkv(), backend="reference")
    assert last_backend().peaky_tiles == 0
    sageattn(*_qkv(), backend="sdpa")
    assert last_backend().peaky_tiles is None


def test_a_peaky_direct_call_is_in_its_record_and_warned_by_the_end_of_the_block():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with record_backends() as log:
            sageattn(*_qkv(30.0, seed=1), backend="reference")
            flagged = last_backend()
            assert log.peaky == {}  # not read inside the call
        assert flagged.peaky_tiles == 4  # both heads' query tiles
    (key,) = log.peaky
    assert key.startswith("sageattn (1, 2, 256, 64) int8-fp16") and log.summary()["peaky"] == {key: 4}
    assert any("past INT8's accuracy" in str(w.message) for w in caught)


def test_a_later_call_reads_the_previous_ones_count_without_waiting():
    """The count is read by the first later call that finds it computed (on the CPU: the next call; on a
    GPU it lands in pinned memory behind the call), at the latest by the end of the block."""
    with pytest.warns(UserWarning, match="past INT8's accuracy"), record_backends() as log:
        sageattn(*_qkv(30.0, seed=2), backend="reference", pv="fp8")
        sageattn(*_qkv(seed=3), backend="reference", pv="fp8")
        if not torch.cuda.is_available():
            assert sum(log.peaky.values()) > 0
    assert sum(log.peaky.values()) > 0


def test_a_call_made_while_a_cuda_graph_is_captured_queues_and_reads_nothing(monkeypatch):
    """While a graph is captured no host code may query or copy (it would end the capture): a direct call
    then neither reads earlier counts nor queues its own; its record still holds the count, read when
    asked after the capture. (`records.capturing` is what torch says on a GPU; set here.)"""
    read = []
    monkeypatch.setattr(records, "read_direct_counts", lambda wait_for=0: read.append(wait_for))
    monkeypatch.setattr(records, "capturing", lambda: True)
    with record_backends():
        sageattn(*_qkv(30.0, seed=4), backend="reference")
        captured = last_backend()
        assert records._pending_direct() == [] and read == []
        monkeypatch.setattr(records, "capturing", lambda: False)
        sageattn(*_qkv(seed=5), backend="reference")  # outside a capture: reads, and queues its own
        assert read == [0] and len(records._pending_direct()) == 1
    assert captured.peaky_tiles == 4
    records._pending_direct().clear()


@pytest.mark.slow  # torch.compile
def test_a_compiled_function_calling_sageattn_records_its_count():
    torch._dynamo.reset()

    @torch.compile(backend="aot_eager", fullgraph=True)
    def attend(q, k, v):
        return sageattn(q, k, v, backend="reference")

    with record_backends() as log:
        attend(*_qkv(30.0, seed=4))
        attend(*_qkv(seed=5))
    assert log.counts == {"reference/fp16": 2}
    assert [c.peaky_tiles for c in log.choices] == [4, 0]
    assert sum(log.peaky.values()) == 4
