"""NoiseFirstDPMScheduler against its named reference, diffusers' CogVideoXDPMScheduler: the same
samples bit for bit, step by step and through a whole pipeline call; swapped in on load and
recorded; refused (diffusers' kept) when the installed diffusers' step is not the copied one."""

import logging

import pytest
import torch
from diffusers import CogVideoXDDIMScheduler, CogVideoXDPMScheduler

from sagevideo.pipelines.cogvideox.noise_first import (
    NoiseFirstDPMScheduler,
    noise_first_problem,
    same_config,
    use_noise_first,
)
from sagevideo.pipelines.forwards import COGVIDEOX_5B_SCHEDULER

SHAPE = (1, 3, 4, 5, 6)  # (batch, latent frames, channels, height, width)


def public(config) -> dict:
    return {key: value for key, value in config.items() if not key.startswith("_")}


def run_schedule(cls: type, steps: int, dtype: torch.dtype, generator_seed: int | None,
                 device: str = "cpu", **config) -> list[torch.Tensor]:
    """Every (sample, predicted x0) of a `steps`-step schedule driven as CogVideoXPipeline drives
    it (timesteps and tensors on `device`), with fixed model outputs; noise from a CPU generator,
    or the global RNG (seed None)."""
    scheduler = cls(**(COGVIDEOX_5B_SCHEDULER | config))
    scheduler.set_timesteps(steps, device=device)
    inputs = torch.Generator().manual_seed(0)
    sample = torch.randn(SHAPE, generator=inputs).to(device, dtype)
    generator = None if generator_seed is None else torch.Generator().manual_seed(generator_seed)
    if generator is None:
        torch.manual_seed(7)
    old, seen = None, []
    for i, t in enumerate(scheduler.timesteps):
        model_output = torch.randn(SHAPE, generator=inputs).to(device, dtype)
        back = scheduler.timesteps[i - 1] if i > 0 else None
        sample, old = scheduler.step(model_output, old, t, back, sample, generator=generator, return_dict=False)
        seen += [sample, old]
    return seen


@pytest.mark.gpu
def test_on_cuda_with_a_cpu_generator_it_is_bit_identical_too():
    """As the product runs it: timesteps and latents on the GPU, the noise from a CPU generator."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    want = run_schedule(CogVideoXDPMScheduler, 50, torch.bfloat16, 3, device="cuda")
    got = run_schedule(NoiseFirstDPMScheduler, 50, torch.bfloat16, 3, device="cuda")
    assert all(a.is_cuda and torch.equal(a, b) for a, b in zip(want, got, strict=True))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("generator_seed", [3, None], ids=["cpu-generator", "global-rng"])
def test_the_5b_schedule_is_bit_identical_to_diffusers(dtype, generator_seed):
    want = run_schedule(CogVideoXDPMScheduler, 50, dtype, generator_seed)
    got = run_schedule(NoiseFirstDPMScheduler, 50, dtype, generator_seed)
    assert len(got) == len(want) == 100
    for i, (a, b) in enumerate(zip(want, got, strict=True)):
        assert a.dtype == b.dtype == dtype
        assert torch.equal(a, b), f"output {i} (step {i // 2 + 1}) differs"


@pytest.mark.parametrize("prediction_type", ["epsilon", "sample"])
def test_the_other_prediction_types_are_bit_identical_too(prediction_type):
    config = dict(prediction_type=prediction_type, rescale_betas_zero_snr=False, timestep_spacing="leading")
    want = run_schedule(CogVideoXDPMScheduler, 20, torch.bfloat16, 3, **config)
    got = run_schedule(NoiseFirstDPMScheduler, 20, torch.bfloat16, 3, **config)
    assert all(torch.equal(a, b) for a, b in zip(want, got, strict=True))


def test_an_unknown_prediction_type_is_refused_by_name():
    scheduler = NoiseFirstDPMScheduler(**COGVIDEOX_5B_SCHEDULER)
    scheduler.register_to_config(prediction_type="flow")
    scheduler.set_timesteps(4)
    x = torch.zeros(SHAPE)
    with pytest.raises(ValueError, match="prediction_type 'flow' is not one of"):
        scheduler.step(x, None, scheduler.timesteps[0], None, x, generator=torch.Generator().manual_seed(0))


def test_the_noise_is_what_makes_the_steps_differ():
    """The comparison above can fail: another noise seed gives other samples from step 1."""
    a = run_schedule(NoiseFirstDPMScheduler, 4, torch.float32, 3)
    b = run_schedule(NoiseFirstDPMScheduler, 4, torch.float32, 4)
    assert not torch.equal(a[0], b[0])


def test_a_pipeline_call_gives_the_same_latents_and_swapping_is_recorded_by_class(tiny_pipe):
    stock = CogVideoXDPMScheduler(**COGVIDEOX_5B_SCHEDULER)
    kept = tiny_pipe.scheduler
    try:
        tiny_pipe.scheduler = stock

        def latents():
            return tiny_pipe(prompt="a cat", num_frames=9, height=32, width=32, num_inference_steps=4,
                             generator=torch.Generator().manual_seed(5), output_type="latent",
                             max_sequence_length=16).frames

        want = latents()
        assert use_noise_first(tiny_pipe) is True
        assert type(tiny_pipe.scheduler) is NoiseFirstDPMScheduler
        assert public(tiny_pipe.scheduler.config) == public(stock.config)
        got = latents()
        assert torch.equal(want, got)
        assert use_noise_first(tiny_pipe) is True  # applied already: left as it is
    finally:
        tiny_pipe.scheduler = kept


def test_other_schedulers_are_left_alone(tiny_pipe, caplog):
    assert isinstance(tiny_pipe.scheduler, CogVideoXDDIMScheduler)  # CogVideoX-2B's: no step noise
    with caplog.at_level(logging.WARNING):
        assert use_noise_first(tiny_pipe) is False
    assert isinstance(tiny_pipe.scheduler, CogVideoXDDIMScheduler) and not caplog.records


class UserDPMScheduler(CogVideoXDPMScheduler):
    """A user's subclass: its step may be anything."""


def test_a_subclass_is_kept_with_a_warning(tiny_pipe, caplog):
    kept = tiny_pipe.scheduler
    try:
        tiny_pipe.scheduler = UserDPMScheduler(**COGVIDEOX_5B_SCHEDULER)
        with caplog.at_level(logging.WARNING):
            assert use_noise_first(tiny_pipe) is False
        assert type(tiny_pipe.scheduler) is UserDPMScheduler
        assert "UserDPMScheduler, not diffusers' CogVideoXDPMScheduler" in caplog.text
    finally:
        tiny_pipe.scheduler = kept


def test_a_diffusers_whose_step_differs_keeps_its_own(tiny_pipe, monkeypatch, caplog):
    """Were diffusers' step to change (another release), the probe finds the copy no longer matches."""
    original = CogVideoXDPMScheduler.step

    def changed(self, model_output, *args, **kwargs):
        prev, x0 = original(self, model_output, *args, **kwargs)
        return prev * 1.001, x0

    monkeypatch.setattr(CogVideoXDPMScheduler, "step", changed)
    scheduler = CogVideoXDPMScheduler(**COGVIDEOX_5B_SCHEDULER)
    problem = noise_first_problem(scheduler)
    assert problem is not None and "gives other samples than sagevideo's copy (step 1" in problem
    kept = tiny_pipe.scheduler
    try:
        tiny_pipe.scheduler = scheduler
        with caplog.at_level(logging.WARNING):
            assert use_noise_first(tiny_pipe) is False
        assert tiny_pipe.scheduler is scheduler and "keeping diffusers' own" in caplog.text
    finally:
        tiny_pipe.scheduler = kept


def test_same_config_skips_private_keys():
    scheduler = CogVideoXDPMScheduler(**COGVIDEOX_5B_SCHEDULER)
    copy = same_config(NoiseFirstDPMScheduler, scheduler)
    assert public(copy.config) == public(scheduler.config) and len(public(copy.config)) > 10


def test_a_loaded_folder_gets_it_and_the_manifest_names_it(tmp_path, tiny_pipe):
    """Through the product: a CogVideoX folder with the 5B's scheduler, loaded by `generate`."""
    import sagevideo
    from sagevideo.outputs.manifest import MANIFEST_NAME, Manifest

    kept = tiny_pipe.scheduler
    try:
        tiny_pipe.scheduler = CogVideoXDPMScheduler(**COGVIDEOX_5B_SCHEDULER)
        tiny_pipe.save_pretrained(tmp_path / "model", safe_serialization=True)
    finally:
        tiny_pipe.scheduler = kept
    records = sagevideo.generate([{"prompt": "a cat", "seed": 1}], model=str(tmp_path / "model"), out=tmp_path / "out",
                                 frames=9, height=32, width=32, steps=2, progress=False)
    assert [r["status"] for r in records] == ["done"]
    assert records[0]["scheduler"] == "NoiseFirstDPMScheduler"
    (line,) = Manifest(tmp_path / "out" / MANIFEST_NAME).records()
    assert line.scheduler == "NoiseFirstDPMScheduler"


def test_the_image_to_video_pipeline_gives_the_same_latents_too():
    """CogVideoX-5B-I2V's pipeline drives the same scheduler (and draws its image latents from the
    generator before the loop): same latents with either scheduler."""
    from PIL import Image

    from sagevideo.pipelines.cogvideox.tiny import tiny_pipeline

    pipe = tiny_pipeline(name="tiny-cogvideox-i2v")
    pipe.set_progress_bar_config(disable=True)
    pipe.scheduler = CogVideoXDPMScheduler(**COGVIDEOX_5B_SCHEDULER)
    image = Image.new("RGB", (32, 32), (200, 40, 90))

    def latents():
        return pipe(image=image, prompt="a cat", num_frames=9, height=32, width=32, num_inference_steps=3,
                    generator=torch.Generator().manual_seed(5), output_type="latent", max_sequence_length=16).frames

    want = latents()
    assert use_noise_first(pipe) is True
    assert torch.equal(want, latents())
