"""One job on a loaded pipeline: checked uint8 frames, NaN/Inf reported with where it appeared."""

import pytest
import torch

from sagevideo.jobs.specs import JobSpec
from sagevideo.pipelines.loading import resolve_model
from sagevideo.pipelines.runner import NonFiniteError, run_job


def _job(**fields):
    return resolve_model("tiny").resolve(JobSpec(prompt="a red panda", **fields))


def test_frames_shape_dtype_and_determinism(tiny_pipe):
    a = run_job(tiny_pipe, _job(), text_tokens=32)
    b = run_job(tiny_pipe, _job(), text_tokens=32)
    assert a.frames.shape == (9, 64, 64, 3) and a.frames.dtype == "uint8"
    assert (a.frames == b.frames).all()
    assert a.denoise_s > 0 and a.decode_s > 0
    assert 0 < a.first_step_s < a.denoise_s  # step 1 of the job's several steps
    c = run_job(tiny_pipe, _job(seed=1), text_tokens=32)
    assert (a.frames != c.frames).any()


def test_nan_in_latents_names_the_step(tiny_pipe, monkeypatch):
    scheduler = tiny_pipe.scheduler
    real_step = type(scheduler).step
    calls = []

    def step(self, *args, **kwargs):
        out = real_step(self, *args, **kwargs)
        calls.append(1)
        if len(calls) == 2:
            out[0][0, 0, 0, 0, 0] = float("nan")
        return out

    monkeypatch.setattr(type(scheduler), "step", step)
    with pytest.raises(NonFiniteError, match=r"after denoising step 2/2"):
        run_job(tiny_pipe, _job(), text_tokens=32)


def test_inf_in_decoded_frames_is_caught_before_clamping(tiny_pipe, monkeypatch):
    real_decode = type(tiny_pipe).decode_latents

    def decode(self, latents):
        video = real_decode(self, latents)
        video[:, :, 4] = float("inf")  # clamping to [0, 1] would hide this as a white frame
        return video

    monkeypatch.setattr(type(tiny_pipe), "decode_latents", decode)
    with pytest.raises(NonFiniteError, match=r"decoded frames \[4\]"):
        run_job(tiny_pipe, _job(), text_tokens=32)
    assert torch.isfinite(torch.zeros(1)).all()
