"""Fixtures for the Open-Sora tests: the tiny transformer loaded from a synthetic official checkpoint."""

from __future__ import annotations

import pytest

from tests.helpers.opensora import TINY, official_tiny_checkpoint


@pytest.fixture(scope="module")
def official_sd():
    return official_tiny_checkpoint()


@pytest.fixture(scope="module")
def tiny_model(official_sd):
    """OpenSoraTransformer3DModel(TINY) with the synthetic official weights, eval mode, fp32."""
    from sagevideo.pipelines.opensora import OpenSoraTransformer3DModel, convert_official_state_dict

    model = OpenSoraTransformer3DModel(**TINY).eval()
    converted, report = convert_official_state_dict(official_sd, model.config)
    assert report.ok, report.describe()
    model.load_state_dict(converted, strict=True)
    return model
