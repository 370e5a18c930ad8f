"""Each job's backend (`generation/backends.py`), decided on the driver from the registry alone."""

from __future__ import annotations

import pytest

from sagevideo.errors import InputError
from sagevideo.generation.backends import resolve_backends
from sagevideo.jobs.config import GenerateConfig
from sagevideo.jobs.specs import JobSpec
from sagevideo.pipelines.loading import resolve_model


def test_cpu_runs_the_emulation_and_full_precision_installs_nothing():
    source = resolve_model("tiny")
    settings = GenerateConfig.build(device="cpu", pv="fp16", out="out")
    jobs = [(JobSpec(prompt="a", attention="sage", pv="fp16"), "job 1"),
            (JobSpec(prompt="b", attention="full"), "job 2")]
    backends, default, notes = resolve_backends(settings, jobs, source, "cpu", "float32")
    assert backends == {("sage", "fp16"): "reference", ("full", None): None} and default == "reference"
    assert any("quantization emulation (reference/fp16)" in n for n in notes)
    assert any("full precision" in n for n in notes)


def test_an_explicit_triton_that_cannot_run_is_refused():
    settings = GenerateConfig.build(device="cpu", pv="fp16", backend="triton", out="out")
    with pytest.raises(InputError, match="--backend triton cannot run"):
        resolve_backends(settings, [(JobSpec(prompt="a", pv="fp16"), "job 1")], resolve_model("tiny"), "cpu", "float32")
