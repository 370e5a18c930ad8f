"""Fixtures for the Wan tests: the built-in tiny Wan pipelines, each built once per session (tests
that change one must undo their changes), and a still image to start videos from."""

from __future__ import annotations

import numpy as np
import pytest


@pytest.fixture(scope="session")
def wan_pipes():
    """name -> the tiny Wan pipeline of that name (fp32, CPU, progress bars off), built on first use."""
    from sagevideo.pipelines.wan.tiny import tiny_pipeline

    class Pipes(dict):
        def __missing__(self, name):
            pipe = self[name] = tiny_pipeline(name)
            pipe.set_progress_bar_config(disable=True)
            return pipe

    return Pipes()


@pytest.fixture(scope="session")
def still(tmp_path_factory):
    """A 64x64 RGB noise still (PNG)."""
    from PIL import Image

    path = tmp_path_factory.mktemp("stills") / "still.png"
    Image.fromarray((np.random.default_rng(0).random((64, 64, 3)) * 255).astype(np.uint8)).save(path)
    return path


@pytest.fixture
def stub_ftfy(monkeypatch):
    """diffusers 0.42's WanImageToVideoPipeline calls ftfy.fix_text without checking that ftfy is
    installed (WanPipeline checks): for the tests that call that pipeline itself as the reference,
    an identity stand-in where ftfy is missing (fix_text leaves the ASCII prompts of these tests as
    they are)."""
    import diffusers.pipelines.wan.pipeline_wan_i2v as i2v

    if not hasattr(i2v, "ftfy"):
        monkeypatch.setattr(i2v, "ftfy", type("ftfy", (), {"fix_text": staticmethod(lambda text: text)}),
                            raising=False)
