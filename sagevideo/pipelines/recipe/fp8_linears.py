"""FP8 linears (`--linear fp8`): torchao's float8 rowwise linears on the transformer blocks'
nn.Linear layers, whether this machine runs them (`fp8_linear_problem`), and their bf16 weights
kept for the job's `linear_bf16_steps` (`Bf16Steps`)."""

from __future__ import annotations

import fnmatch
import importlib.util
from dataclasses import dataclass, field
from typing import Any

from sagevideo.choices import FP8_CAPABILITY, has_fp8_tensor_cores
from sagevideo.jobs.recipe import Recipe

FP8_MULTIPLE = 16  # float8 GEMMs (torch._scaled_mm) need in/out features divisible by 16


def torchao_problem() -> str | None:
    """Why torchao's float8 linears cannot be used here (not installed, too old), or None."""
    if importlib.util.find_spec("torchao") is None:
        return "torchao is not installed (pip install torchao)"
    try:
        from torchao.quantization import Float8DynamicActivationFloat8WeightConfig, PerRow  # noqa: F401
    except ImportError as err:
        return f"this torchao has no Float8DynamicActivationFloat8WeightConfig/PerRow ({err}); upgrade torchao"
    return None


def fp8_linear_problem(device: str, dtype: str) -> str | None:
    """Why float8 rowwise linears cannot run on `device` in `dtype`, or None."""
    import torch

    sm = "sm" + "".join(map(str, FP8_CAPABILITY))
    if device != "cuda" or not torch.cuda.is_available():
        return f"float8 linears need a CUDA GPU with FP8 tensor cores ({sm}+), not {device}"
    if not has_fp8_tensor_cores(device):
        major, minor = torch.cuda.get_device_capability()
        return f"float8 linears need FP8 tensor cores ({sm}+); this GPU is sm{major}{minor}"
    if dtype != "bfloat16":
        return f"float8 rowwise linears run on bfloat16 models, not {dtype}; use --dtype bfloat16"
    return torchao_problem()


@dataclass
class Bf16Steps:
    """linear_bf16_steps at work: each float8 linear's bf16 weight kept beside its float8 one and
    put back for the job's bf16 steps (`use`, called between steps, outside compiled code). A
    compiled block compiles once for each kind of weight and then runs either without recompiling."""

    recipe: Recipe
    weights: list[tuple[Any, Any, Any]]  # (linear, its bf16 weight, its float8 weight)
    job_steps: int | None = None  # the running job's steps; None: no job started (the guard refuses)
    bf16: list[int] = field(default_factory=list)  # this job's bf16 step indices
    ran_bf16: list[int] = field(default_factory=list)  # the steps that ran so far with bf16 weights
    in_bf16: bool = False

    def start(self, steps: int) -> None:
        problem = self.recipe.step_problem(steps)
        if problem:
            raise ValueError(f"--linear-bf16-steps: {problem}")
        self.job_steps, self.bf16, self.ran_bf16 = steps, self.recipe.bf16_steps_of(steps), []
        self.use(0)

    def use(self, step: int) -> None:
        """The weights of step `step` (0-based; `job_steps` and beyond: after the last, kept)."""
        if self.job_steps is None or step >= self.job_steps:
            return
        want = step in self.bf16
        if want != self.in_bf16:
            for linear, bf16_weight, fp8_weight in self.weights:
                linear._parameters["weight"] = bf16_weight if want else fp8_weight
            self.in_bf16 = want
        if want:
            self.ran_bf16.append(step)

    def refuse_unknown_steps(self, module: Any, args: Any) -> None:
        """Forward pre-hook of each denoiser: without a job's steps the right weights are unknown."""
        if self.job_steps is None:
            raise RuntimeError(
                "--linear-bf16-steps: the denoiser ran before a job said its steps, so which steps run in bf16 "
                "is unknown; generate through sagevideo (generate, ab, calibrate, PipelineHost), or call the "
                "AppliedRecipe's start_job(steps=N) before the pipeline and on_step(step, steps) after each step")


def fp8_linears(denoisers: list[tuple[str, Any, list[tuple[str, Any]]]], keep: list[str],
                 applied: Any) -> None:
    """denoisers: (name prefix, transformer, its blocks) of each denoiser; the layers made float8 and
    kept go into `applied` (an `AppliedRecipe`), with their `Bf16Steps` where linear_bf16_steps asks."""
    import torch
    from torchao.quantization import Float8DynamicActivationFloat8WeightConfig, PerRow, quantize_

    blocks = [(f"{prefix}{bname}", block) for prefix, _, found in denoisers for bname, block in found]
    linears = [(f"{bname}.{name}", m) for bname, block in blocks for name, m in block.named_modules()
               if isinstance(m, torch.nn.Linear)]
    unmatched = [p for p in keep if not any(fnmatch.fnmatchcase(name, p) for name, _ in linears)]
    if unmatched:
        shown = ", ".join(n for n, _ in linears[:3])
        raise ValueError(f"--linear-keep {unmatched[0]}: names no linear of the transformer's blocks (e.g. {shown})")
    chosen = set()
    for name, module in linears:
        if any(fnmatch.fnmatchcase(name, p) for p in keep) or module.in_features % FP8_MULTIPLE \
                or module.out_features % FP8_MULTIPLE:
            applied.kept_layers.append(name)
        else:
            chosen.add(id(module))
            applied.fp8_layers.append(name)
    # set_inductor_config=False: torchao's default turns on Inductor's coordinate-descent tuning
    # for the whole process, which made the first call of a compiled FP8 block take minutes
    # (Triton configs compiled one after another in the main thread) and changed how every other
    # graph the user compiles is tuned. The recipe leaves Inductor's settings as the user set them.
    config = Float8DynamicActivationFloat8WeightConfig(granularity=PerRow(), set_inductor_config=False)
    kept = {id(m): (m, m.weight) for _, m in linears if id(m) in chosen} if applied.recipe.linear_bf16_steps else {}
    for _, block in blocks:
        quantize_(block, config, filter_fn=lambda module, fqn: id(module) in chosen)
    if kept:
        applied.bf16_steps = Bf16Steps(applied.recipe, [(m, bf16, m.weight) for m, bf16 in kept.values()])
