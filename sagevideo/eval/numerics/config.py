"""`SimulateConfig`: every option of `sagevideo simulate`, declared once (no torch here)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from sagevideo.choices import Granularity

Preset = Literal["random", "k-offset", "q-outlier", "peaky", "near-uniform", "padded", "large"]  # presets.PRESETS
SimPV = Literal["fp16", "fp8", "fp32", "int8-naive"]  # simulate.SIM_PV_MODES
OnOff = Literal["on", "off", "both"]
Layout = Literal["HND", "NHD"]
SimDType = Literal["fp16", "bf16", "fp32"]


def _shape(value: Any) -> Any:
    """'1,8,1024,128' (the command line's spelling) -> (1, 8, 1024, 128)."""
    if isinstance(value, str):
        try:
            value = tuple(int(x) for x in value.split(","))
        except ValueError:
            value = ()
    if not (isinstance(value, (tuple, list)) and len(value) == 4 and all(isinstance(x, int) and x >= 1 for x in value)):
        raise ValueError("give B,H,N,D as four positive integers, e.g. 1,8,1024,128")
    return tuple(value)


class SimulateConfig(BaseModel):
    """Inputs, variants and output of one simulation (see `sagevideo.eval.numerics.simulate`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    preset: Preset = Field("k-offset", description="Synthetic inputs (ignored with --qkv).")
    qkv: Path | None = Field(None, description="safetensors file of captured q/k/v (or <layer>.q/.k/.v), (B, H, N, D), "
                             "e.g. written by `sagevideo calibrate --save-qkv FILE`.")
    layout: Layout = Field("HND", description="Layout of the --qkv tensors: HND or NHD.")
    shape: Annotated[tuple[int, int, int, int], BeforeValidator(_shape)] = Field(
        (1, 8, 1024, 128), description="B,H,N,D of the synthetic inputs."
    )
    seed: int = Field(0, description="Seed of the synthetic inputs.")
    pv: list[SimPV] | None = Field(
        None, description="PV precision(s) to compare (repeatable); int8-naive is the seed's naive INT8 PV."
    )
    smooth_k: OnOff = Field("both", description="Subtract the mean of K: on, off or both.")
    rotate: OnOff = Field("on", description="Hadamard-rotate Q and K: on, off or both.")
    qk_bits: int = Field(8, ge=2, le=16, description="Bits of the Q/K integer quantization.")
    granularity: Granularity = Field("block", description="Q/K scale per tile or per token.")
    block_m: int | None = Field(None, ge=1, description="Q tile (default: the kernel plan's).")
    block_n: int | None = Field(None, ge=1, description="K tile (default: the kernel plan's).")
    dtype: SimDType = Field("fp32", description="Input dtype before quantization: fp16, bf16 or fp32.")
    json_out: Path | None = Field(None, description="Also write the figures as JSON.")

    @classmethod
    def build(cls, **options: Any) -> SimulateConfig:
        """InputError naming every bad option at once."""
        from sagevideo.jobs.problems import options_error

        try:
            return cls(**options)
        except ValidationError as err:
            raise options_error(err) from None

    @property
    def pv_modes(self) -> list[str]:
        return list(self.pv or ["fp16", "fp8"])

    def variants(self) -> list[Any]:
        """The grid of variants: every PV mode x smoothing x rotation asked for."""
        from sagevideo.eval.numerics.simulate import variant_grid

        settings = {"on": [True], "off": [False], "both": [False, True]}
        return variant_grid(
            self.pv_modes, settings[self.smooth_k], settings[self.rotate], qk_bits=self.qk_bits,
            granularity=self.granularity, block_m=self.block_m, block_n=self.block_n,
        )
