"""A two-node Ray cluster on this machine (ray.cluster_utils.Cluster), joined through `address`."""

from __future__ import annotations

import pytest

ray = pytest.importorskip("ray")

import sagevideo  # noqa: E402
from sagevideo.jobs.specs import InputError  # noqa: E402

OBJECT_STORE_BYTES = 80 * 2**20  # as in conftest: jobs return file names, not frames


@pytest.fixture
def two_nodes():
    """A head and a worker node of one CPU each: one sagevideo worker fits on each."""
    from ray.cluster_utils import Cluster

    assert not ray.is_initialized()
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "include_dashboard": False, "object_store_memory": OBJECT_STORE_BYTES},
    )
    cluster.add_node(num_cpus=1, object_store_memory=OBJECT_STORE_BYTES)
    cluster.wait_for_nodes()
    yield cluster
    if ray.is_initialized():
        ray.shutdown()
    cluster.shutdown()


@pytest.mark.slow
def test_batch_runs_across_both_nodes_through_address(tmp_path, two_nodes):
    out = tmp_path / "out"
    # Jobs long enough (6 x ~1.5 s) that the first worker cannot drain the queue while the second
    # is still importing diffusers (~5-8 s): both nodes must get work.
    records = sagevideo.generate(
        [f"shot {i}" for i in range(6)], out=out, address=two_nodes.address, device="cpu", steps=8,
        frames=17, progress=False,
    )
    assert [r["status"] for r in records] == ["done"] * 6
    assert len({r["worker"]["node"] for r in records}) == 2  # default on CPU: one worker per node
    assert not ray.is_initialized()  # the run disconnected from the cluster it joined
    assert sorted(p.name for p in out.iterdir()) == sorted(["manifest.jsonl", *(r["outputs"][0] for r in records)])


def test_unreachable_address_is_a_clear_error_before_anything_loads(tmp_path, monkeypatch):
    import sagevideo.pipelines.loading as loading

    monkeypatch.setattr(loading, "load_pipeline", lambda *a, **k: pytest.fail("model loaded"))
    with pytest.raises(InputError, match=r"--address 127\.0\.0\.1:9: no Ray cluster answers there \(.*\); start one"):
        sagevideo.generate(["a cat"], out=tmp_path / "out", address="127.0.0.1:9", progress=False)
    assert not ray.is_initialized()
