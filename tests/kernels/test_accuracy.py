"""The accuracy contract (DESIGN §2) against fp64 attention on adversarial inputs, worst case first.

16-bit PV runs through the Triton kernel (interpreter on CPU); FP8 PV through the reference on
CPU (the interpreter's float8 cast is inexact) and through the kernel on GPU (test_gpu.py).
The floors are `sagevideo.eval.numerics.floors.CONTRACT`; the cases that measure short of it at
this size are listed once, in its `SHORTFALLS`, and asserted there: still short (else the entry
goes) and above the floor written beside them.
"""

import pytest
import torch

from sagevideo import last_backend, sageattn
from sagevideo.attention.accuracy import attention_fp64, error_stats
from sagevideo.eval.numerics.floors import CONTRACT, METRICS, Floors, shortfall
from sagevideo.eval.numerics.presets import CONTRACT_PRESETS, make_inputs

pytestmark = pytest.mark.kernels  # Triton kernels, interpreted on a CPU: make test-fast leaves them out

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SHAPE = (1, 4, 256, 64)


def _run(preset, pv, backend, dtype=torch.float16, shape=SHAPE):
    x = make_inputs(preset, shape, seed=1)
    q, k, v = (t.to(DEVICE, dtype) for t in (x.q, x.k, x.v))
    mask = None if x.key_mask is None else x.key_mask.to(DEVICE)
    out = sageattn(q, k, v, pv=pv, backend=backend, attn_mask=None if mask is None else mask[:, None, None, :])
    assert last_backend().ran == backend
    ref = attention_fp64(q, k, v, key_mask=mask)
    return error_stats(ref, out)


RUNS = {"fp16": "triton", "fp8": "reference"}  # pv -> the backend measured on this machine
CASES = [(pv, preset, metric) for pv in RUNS for preset in CONTRACT_PRESETS for metric in METRICS]


@pytest.fixture(scope="module")
def measured():
    """(pv, preset) -> its ErrorStats, each case run once for the contract and the shortfall tests."""
    return {(pv, preset): _run(preset, pv, backend) for pv, backend in RUNS.items() for preset in CONTRACT_PRESETS}


@pytest.mark.parametrize("pv, preset, metric", [c for c in CASES if shortfall(*c) is None])
def test_meets_contract(measured, pv, preset, metric):
    e = measured[pv, preset]
    assert e.nonfinite == 0
    assert CONTRACT[pv].holds(metric, getattr(e, metric)), (CONTRACT[pv].misses(e), e)


@pytest.mark.parametrize("pv, preset, metric", [c for c in CASES if shortfall(*c) is not None])
def test_shortfalls_are_still_short_and_above_their_floor(measured, pv, preset, metric):
    e = measured[pv, preset]
    value, floor = getattr(e, metric), shortfall(pv, preset, metric)
    assert not CONTRACT[pv].holds(metric, value), f"{pv} {preset} {metric} {value} meets the contract now: " \
        "remove its entry from floors.SHORTFALLS"
    assert Floors(**{**vars(CONTRACT[pv]), metric: floor}).holds(metric, value), (value, floor, e)


@pytest.mark.parametrize("pv, backend", [("fp16", "triton"), ("fp8", "reference")])
def test_large_magnitudes_stay_finite(pv, backend):
    """Scores of ~1e7 (inputs ~1e3): attention is one-hot, the output must stay finite."""
    e = _run("large", pv, backend)
    assert e.nonfinite == 0
    assert e.cos_worst > 0.9  # one-hot attention: INT8 may pick a near-tied key, never garbage


def test_rotation_is_what_rescues_q_outliers():
    """Without rotation, per-block INT8 misses the contract on a Q channel outlier (DESIGN §2)."""
    x = make_inputs("q-outlier", SHAPE, seed=1)
    q, k, v = (t.to(DEVICE, torch.float16) for t in (x.q, x.k, x.v))
    ref = attention_fp64(q, k, v)
    plain = error_stats(ref, sageattn(q, k, v, backend="reference", rotate_qk=False))
    rotated = error_stats(ref, sageattn(q, k, v, backend="reference", rotate_qk=True))
    floor = CONTRACT["fp16"].cos_worst
    assert plain.cos_worst < floor <= rotated.cos_worst
