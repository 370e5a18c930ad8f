"""Repository-level pytest set-up (loaded before any test module).

Without a GPU, the Triton kernels run under Triton's CPU interpreter; TRITON_INTERPRET must be
set before the kernels are decorated, i.e. before `sagevideo.kernels.quantize` is imported.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def pytest_collection_modifyitems(config, items):
    import pytest

    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU (run on the H200: pytest -m gpu)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)
