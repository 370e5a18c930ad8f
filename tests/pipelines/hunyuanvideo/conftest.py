"""The tiny HunyuanVideo pipeline, built once for this folder (tests that change it undo it)."""

import pytest


@pytest.fixture(scope="session")
def hunyuan_pipe():
    from sagevideo.pipelines.hunyuanvideo.tiny import tiny_pipeline

    pipe = tiny_pipeline()
    pipe.set_progress_bar_config(disable=True)
    return pipe

