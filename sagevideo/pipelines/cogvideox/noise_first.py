"""CogVideoX-5B's DPM scheduler with its step noise drawn before the step waits for the device.

diffusers' `CogVideoXDPMScheduler.step` reads its timestep on the host (indexing `alphas_cumprod`
with a device tensor, `prev_timestep >= 0`), which waits for the transformer forward to finish,
and only then draws one or two noise tensors from the job's generator. sagevideo draws noise on
a CPU generator (a seed gives the same video on every device), and a CPU draw at the 5B video's
latent shape takes tens of milliseconds in bf16 (33–40 ms each on the H200's host under torch.profiler; see
docs/benchmarks-history.md): the device idles through both draws, every step.

`NoiseFirstDPMScheduler` is the same scheduler with one change: `step` draws its noise first,
while the device is still running the forward, then does diffusers' arithmetic unchanged. The noise
values are the same draws in the same order, so every latent is bit-identical to diffusers'
(checked by `noise_first_problem` against the installed diffusers before a pipeline gets it). The
one difference: a step that uses a single draw but follows another step (the last one, where
`prev_timestep < 0`) draws a second it does not use, so the generator ends one draw further on; the
denoising loop draws nothing after it.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from diffusers import CogVideoXDPMScheduler
from diffusers.schedulers.scheduling_ddim import DDIMSchedulerOutput
from diffusers.utils.torch_utils import randn_tensor

log = logging.getLogger(__name__)

PROBE_SHAPE = (1, 2, 4, 3, 3)  # (batch, frames, channels, height, width): a latent, tiny
PROBE_STEPS = 4


class NoiseFirstDPMScheduler(CogVideoXDPMScheduler):
    """`CogVideoXDPMScheduler` whose `step` draws its noise before anything waits for the device
    (see the module docstring); same config, same signature, same results."""

    def step(
        self,
        model_output: torch.Tensor,
        old_pred_original_sample: torch.Tensor | None,
        timestep: Any,
        timestep_back: Any,
        sample: torch.Tensor,
        eta: float = 0.0,
        use_clipped_model_output: bool = False,
        generator: torch.Generator | None = None,
        variance_noise: torch.Tensor | None = None,
        return_dict: bool = False,
    ) -> DDIMSchedulerOutput | tuple:
        """One DPM-Solver++(2M) SDE step from `timestep` (`timestep_back`: the step before, None on
        the first) -> (previous sample, predicted x0), as `CogVideoXDPMScheduler.step` computes them
        (eta, use_clipped_model_output and variance_noise are unused there too). With
        return_dict, a `DDIMSchedulerOutput`, except on a first-order step (the first and the last),
        which returns the tuple whatever return_dict says, as diffusers' does."""
        if self.num_inference_steps is None:
            raise ValueError(f"{type(self).__name__}.step: call set_timesteps(num_inference_steps) first")
        # Drawn before anything below reads a device value; a later step draws twice (the last
        # step's second draw goes unused).
        drawn = [_draw(sample, generator) for _ in range(1 if old_pred_original_sample is None else 2)]
        noise = [n.to(sample.device) for n in drawn]

        prev_timestep = timestep - self.config.num_train_timesteps // self.num_inference_steps
        alpha = self.alphas_cumprod[timestep]
        alpha_prev = self.alphas_cumprod[prev_timestep] if prev_timestep >= 0 else self.final_alpha_cumprod
        alpha_back = None if timestep_back is None else self.alphas_cumprod[timestep_back]
        x0 = self._predicted_x0(model_output, sample, alpha)
        h, r, _, _ = self.get_variables(alpha, alpha_prev, alpha_back)
        mult = self.get_mult(h, r, alpha, alpha_prev, alpha_back)
        noise_scale = (1 - alpha_prev) ** 0.5 * (1 - (-2 * h).exp()) ** 0.5
        if old_pred_original_sample is None or prev_timestep < 0:
            return mult[0] * sample - mult[1] * x0 + noise_scale * noise[0], x0
        x0_extrapolated = mult[2] * x0 - mult[3] * old_pred_original_sample
        prev_sample = mult[0] * sample - mult[1] * x0_extrapolated + noise_scale * noise[1]
        if return_dict:
            return DDIMSchedulerOutput(prev_sample=prev_sample, pred_original_sample=x0)
        return prev_sample, x0

    def _predicted_x0(self, model_output: torch.Tensor, sample: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
        """x0 from the model's output by the config's prediction type (alpha: alphas_cumprod at t)."""
        kind = self.config.prediction_type
        if kind == "v_prediction":
            return alpha**0.5 * sample - (1 - alpha) ** 0.5 * model_output
        if kind == "epsilon":
            return (sample - (1 - alpha) ** 0.5 * model_output) / alpha**0.5
        if kind == "sample":
            return model_output
        raise ValueError(f"{type(self).__name__}: prediction_type {kind!r} is not one of "
                         "'epsilon', 'sample', 'v_prediction'")


def _draw(sample: torch.Tensor, generator: Any) -> torch.Tensor:
    """One noise tensor shaped like `sample`, drawn as diffusers' `randn_tensor` draws it but left
    where the generator lives (a CPU generator's draw is moved to the device by the caller, after
    every draw of the step: moving it waits for the device)."""
    first = generator[0] if isinstance(generator, list) and generator else generator
    where = first.device if isinstance(first, torch.Generator) else sample.device
    return randn_tensor(sample.shape, generator=generator, device=where, dtype=sample.dtype)


def noise_first_problem(scheduler: Any) -> str | None:
    """Why `scheduler` cannot be swapped for `NoiseFirstDPMScheduler` (None: it can): it must be a
    `CogVideoXDPMScheduler` exactly (a subclass may change `step`), and with its config both must
    give bit-identical samples over a short schedule on the CPU, in float32 and bf16, the same seeds
    each (this diffusers' `step` is the one the copy was made from)."""
    if type(scheduler) is not CogVideoXDPMScheduler:
        return f"the scheduler is a {type(scheduler).__name__}, not diffusers' CogVideoXDPMScheduler"
    for dtype in (torch.float32, torch.bfloat16):
        want = _probe(same_config(CogVideoXDPMScheduler, scheduler), dtype)
        got = _probe(same_config(NoiseFirstDPMScheduler, scheduler), dtype)
        for i, (a, b) in enumerate(zip(want, got, strict=True)):
            if not torch.equal(a, b):
                return (f"this diffusers' CogVideoXDPMScheduler.step gives other samples than sagevideo's copy "
                        f"(step {i // 2 + 1} of a {PROBE_STEPS}-step {dtype} probe): keeping diffusers' own")
    return None


def _probe(scheduler: Any, dtype: torch.dtype) -> list[torch.Tensor]:
    """Every (sample, predicted x0) of a PROBE_STEPS schedule driven as CogVideoXPipeline drives it."""
    scheduler.set_timesteps(PROBE_STEPS)
    inputs, noise = torch.Generator().manual_seed(1), torch.Generator().manual_seed(2)
    sample = torch.randn(PROBE_SHAPE, generator=inputs).to(dtype)
    old, seen = None, []
    for i, t in enumerate(scheduler.timesteps):
        model_output = torch.randn(PROBE_SHAPE, generator=inputs).to(dtype)
        back = scheduler.timesteps[i - 1] if i > 0 else None
        sample, old = scheduler.step(model_output, old, t, back, sample, generator=noise, return_dict=False)
        seen += [sample, old]
    return seen


def use_noise_first(pipe: Any) -> bool:
    """Give `pipe` (a CogVideoX pipeline) `NoiseFirstDPMScheduler` in place of its
    `CogVideoXDPMScheduler`, same config. Returns whether it did; a DPM scheduler it cannot swap
    (`noise_first_problem`) is kept, with a warning saying why. Other schedulers (CogVideoX-2B's DDIM)
    draw no noise in their steps and are left as they are, silently."""
    scheduler = pipe.scheduler
    if not isinstance(scheduler, CogVideoXDPMScheduler) or isinstance(scheduler, NoiseFirstDPMScheduler):
        return isinstance(scheduler, NoiseFirstDPMScheduler)
    problem = noise_first_problem(scheduler)
    if problem is not None:
        log.warning("sagevideo: the DPM scheduler's step noise stays drawn after the device wait: %s", problem)
        return False
    pipe.scheduler = same_config(NoiseFirstDPMScheduler, scheduler)
    return True


def same_config(cls: type, scheduler: Any) -> Any:
    """A new `cls` with `scheduler`'s config (its init arguments: the registered config less
    diffusers' private keys). `from_config` would do the same, after importing every scheduler
    module diffusers lists as compatible (about a second, the first time in a process)."""
    return cls(**{key: value for key, value in scheduler.config.items() if not key.startswith("_")})
