"""Fixtures of the kernel tests."""

import pytest
import torch


@pytest.fixture
def hopper(monkeypatch):
    """A Hopper GPU as the plans see it (capability 9.0, no ROCm), SAGEVIDEO_SM90_KERNEL unset."""
    from sagevideo.kernels import plans

    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    monkeypatch.delenv(plans.SM90_KERNEL_ENV, raising=False)
    # The real compile check cannot run under the CPU interpreter (tests/kernels/test_plans.py
    # compiles in a clean process instead); here it passes unless a test says otherwise.
    monkeypatch.setattr(plans, "gluon_sm90_compile_problem", lambda block_d, stages: "")
