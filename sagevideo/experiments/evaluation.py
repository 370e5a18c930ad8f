"""The evaluation's options, declared once: `sagevideo eval` builds an `EvalConfig`, `sagevideo ab`
takes `EvalSettings` beside its `ABConfig`, `sagevideo check-weights` a `WeightsOptions`; each turns
into what `sagevideo.eval` runs with (`EvalSettings.options()`: an `EvalOptions`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from sagevideo.jobs.config import DeviceOptions

LpipsNet = Literal["alex", "vgg"]


class WeightsOptions(BaseModel):
    """Where the metrics' weights are, and which LPIPS backbone reads them."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    cli_panel: ClassVar[str] = "Evaluation"

    weights: Path | None = Field(
        None,
        description="Folder of the metrics' weights (default $SAGEVIDEO_WEIGHTS or ~/.cache/sagevideo/weights; see "
        "`sagevideo check-weights`).",
    )
    lpips_net: LpipsNet = Field("alex", description="LPIPS backbone.")


class EvalSettings(DeviceOptions, WeightsOptions):
    """What an evaluation computes (with `WeightsOptions`) and where its networks run (`DeviceOptions`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    cli_panel: ClassVar[str] = "Evaluation"

    metrics: list[str] | None = Field(
        None,
        description="Metrics to compute (repeatable or comma-separated): psnr, ssim, lpips, clipsim, clip_t, fid, kid, "
        "or all (default). Metrics whose weights are missing are skipped.",
    )
    resamples: int = Field(1000, ge=100, description="Bootstrap resamples over prompts (95% CI).")
    set_resamples: int = Field(
        50, ge=10, description="Bootstrap resamples for FID/KID (each recomputes them from cached features)."
    )
    diff_gain: float = Field(8.0, ge=1.0, description="Amplification of |test - reference| in difference videos.")

    def options(self) -> Any:
        """These settings as the `sagevideo.eval.evaluate.EvalOptions` an evaluation runs with."""
        from sagevideo.choices import resolve_device
        from sagevideo.eval.evaluate import EvalOptions
        from sagevideo.eval.stats import Bootstrap

        return EvalOptions(
            metrics=self.metrics or None, weights=self.weights, device=resolve_device(self.device),
            lpips_net=self.lpips_net, bootstrap=Bootstrap(resamples=self.resamples, set_resamples=self.set_resamples),
            diff_gain=self.diff_gain,
        )

    @classmethod
    def build(cls, **fields: Any) -> Any:
        """A config of this class from `fields`; InputError naming each bad one."""
        from sagevideo.jobs.problems import options_error

        try:
            return cls(**fields)
        except ValidationError as err:
            raise options_error(err) from None


class EvalConfig(EvalSettings):
    """What `sagevideo eval` compares: two output folders (paired by prompt and seed), with the
    evaluation's settings (`EvalSettings`)."""

    ref_dir: Path = Field(description="Reference output folder (full precision), with manifest.jsonl.")
    test_dir: Path = Field(description="Test output folder (e.g. quantized), with manifest.jsonl.")
    out: Path = Field(description="Folder for metrics.json, report.html and figures.")
    noise_ref: Path | None = Field(
        None, description="A second full-precision run with the same seeds: the noise floor."
    )
