"""CPU tensors planned as on an H200 (sm90: the Gluon kernel where "auto" takes it) and computed by
the interpreter, for tests that check which kernel a call is planned on without a GPU."""

from __future__ import annotations

import pytest
import torch


def plan_cpu_calls_as_h200(monkeypatch: pytest.MonkeyPatch) -> None:
    """Plans see capability 9.0, no ROCm and arch sm90 for every device, the Gluon kernel's compile check
    passes (it cannot run under the interpreter) and SAGEVIDEO_SM90_KERNEL is unset; undone with
    `monkeypatch`."""
    from sagevideo.kernels import plans

    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    monkeypatch.setattr(plans, "arch_of", lambda device: ("sm90", ""))
    monkeypatch.setattr(plans, "gluon_sm90_compile_problem", lambda block_d, stages: "")
    monkeypatch.delenv(plans.SM90_KERNEL_ENV, raising=False)
