"""sagevideo.errors: every user-facing exception has its exit code; the old import places name the same
classes. (The CLI's mapping, `cli.common.handle_errors`: tests/cli/test_common.py.)"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from sagevideo import errors


@pytest.mark.parametrize(
    "err, code",
    [
        (errors.InputError("x"), 2),
        (errors.EvalInputError("x"), 2),
        (errors.PairingError("x"), 2),
        (errors.ModelLoadError("x"), 1),
        (errors.MetricModelError("x"), 1),
        (errors.ABFailed("x"), 1),
        (errors.BatchStopped(SimpleNamespace(stopped="disk full")), 1),
        (errors.BatchInterrupted(SimpleNamespace(signal="SIGINT")), 130),
        (errors.BatchInterrupted(SimpleNamespace(signal="SIGTERM")), 143),
        (errors.BatchInterrupted(SimpleNamespace(signal="SIGHUP")), 129),
        (errors.Terminated(), 143),
        (errors.OutputsNotWritten("x", result={}), 1),
        (OSError(28, "No space left on device"), 1),
        (MemoryError(), 1),
        (errors.Terminated(1), 129),
        (KeyboardInterrupt(), 130),
        (RuntimeError("a bug"), None),
    ],
)
def test_exit_codes(err, code):
    assert errors.exit_code_for(err) == code


def test_old_import_places_still_name_the_same_classes():
    from sagevideo.eval.evaluate import EvalInputError, MetricModelError
    from sagevideo.eval.pairing import PairingError
    from sagevideo.experiments.ab import ABFailed
    from sagevideo.generation.generate import BatchInterrupted, BatchStopped, ModelLoadError
    from sagevideo.host.pipeline_host import ModelLoadError as HostModelLoadError
    from sagevideo.jobs.specs import InputError

    assert InputError is errors.InputError and issubclass(InputError, ValueError)
    assert ModelLoadError is HostModelLoadError is errors.ModelLoadError
    assert (BatchInterrupted, BatchStopped, ABFailed) == (errors.BatchInterrupted, errors.BatchStopped, errors.ABFailed)
    assert (EvalInputError, MetricModelError, PairingError) == (
        errors.EvalInputError, errors.MetricModelError, errors.PairingError
    )


def test_first_line_passes_over_rays_headers_and_caps_the_line():
    from sagevideo.errors import first_line

    err = RuntimeError("ray::Worker.run() (pid=1)\nTraceback (most recent call last):\n  CUDA out of memory\n")
    assert first_line(err) == "CUDA out of memory"
    assert first_line(ValueError("")) == "ValueError"
    assert first_line(ValueError("x" * 400)) == "x" * 300
