"""CogVideoX-5B's DPM scheduler with its step noise drawn before the step waits for the device.

diffusers' `CogVideoXDPMScheduler.step` reads its timestep on the host (indexing `alphas_cumprod`
with a device tensor, `prev_timestep >= 0`), which waits for the transformer forward to finish,
and only then draws one or two noise tensors from the job's generator. sagevideo draws noise on
a CPU generator (a seed gives the same video on every device), and a CPU draw at the 5B video's
latent shape takes tens of milliseconds in bf16 (about 35 ms each on the H200's host; see
docs/benchmarks.md): the device idles through both draws, every step.

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
        """One DPM-Solver++ (2M) SDE step, as `CogVideoXDPMScheduler.step` (eta, use_clipped_model_output and
        variance_noise are ignored there too)."""
        if self.num_inference_steps is None:
            raise ValueError(
                "Number of inference steps is 'None', you need to run 'set_timesteps' after creating the scheduler"
            )
        # The first step draws once; later ones twice (the last one's second draw goes unused).
        draws = [_draw(sample, generator) for _ in range(1 if old_pred_original_sample is None else 2)]
        noises = [noise.to(sample.device) for noise in draws]

        prev_timestep = timestep - self.config.num_train_timesteps // self.num_inference_steps
        alpha_prod_t = self.alphas_cumprod[timestep]
        alpha_prod_t_prev = self.alphas_cumprod[prev_timestep] if prev_timestep >= 0 else self.final_alpha_cumprod
        alpha_prod_t_back = self.alphas_cumprod[timestep_back] if timestep_back is not None else None
        beta_prod_t = 1 - alpha_prod_t
        if self.config.prediction_type == "epsilon":
            pred_original_sample = (sample - beta_prod_t ** (0.5) * model_output) / alpha_prod_t ** (0.5)
        elif self.config.prediction_type == "sample":
            pred_original_sample = model_output
        elif self.config.prediction_type == "v_prediction":
            pred_original_sample = (alpha_prod_t**0.5) * sample - (beta_prod_t**0.5) * model_output
        else:
            raise ValueError(
                f"prediction_type given as {self.config.prediction_type} must be one of `epsilon`, `sample`, or"
                " `v_prediction`"
            )
        h, r, _lamb, _lamb_next = self.get_variables(alpha_prod_t, alpha_prod_t_prev, alpha_prod_t_back)
        mult = list(self.get_mult(h, r, alpha_prod_t, alpha_prod_t_prev, alpha_prod_t_back))
        mult_noise = (1 - alpha_prod_t_prev) ** 0.5 * (1 - (-2 * h).exp()) ** 0.5
        prev_sample = mult[0] * sample - mult[1] * pred_original_sample + mult_noise * noises[0]
        if old_pred_original_sample is None or prev_timestep < 0:
            return prev_sample, pred_original_sample  # a tuple whatever return_dict says, as diffusers'
        denoised_d = mult[2] * pred_original_sample - mult[3] * old_pred_original_sample
        prev_sample = mult[0] * sample - mult[1] * denoised_d + mult_noise * noises[1]
        if not return_dict:
            return (prev_sample, pred_original_sample)
        return DDIMSchedulerOutput(prev_sample=prev_sample, pred_original_sample=pred_original_sample)


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
