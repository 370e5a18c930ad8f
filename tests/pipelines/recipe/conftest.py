"""Fixtures of the recipe's tests: compile-cache variables pointed at a file, torchao's float8
linears on the CPU."""

from __future__ import annotations

import pytest


@pytest.fixture
def cache_env(monkeypatch, tmp_path):
    """No compile-cache variable set, HOME in tmp_path; a file `blocker` to point them at."""
    for name in ("SAGEVIDEO_COMPILE_CACHE", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    blocker = tmp_path / "blocker"
    blocker.write_text("a file, not a folder")
    return blocker


@pytest.fixture
def fp8_on_cpu(monkeypatch):
    """torchao's float8 linears on the CPU (torch has a CPU float8 GEMM): its sm89+ check and
    the recipe's machine check stood in for."""
    pytest.importorskip("torchao")
    import torchao.quantization.quant_api as quant_api

    import sagevideo.pipelines.recipe.apply as recipe_module

    monkeypatch.setattr(quant_api, "_check_hardware_support", lambda granularity: None)
    monkeypatch.setattr(recipe_module, "fp8_linear_problem", lambda device, dtype: None)

