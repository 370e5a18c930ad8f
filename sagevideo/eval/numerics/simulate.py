"""The quantization-error simulator (`sagevideo simulate`): the seed document's simulator, grown up.

It runs attention variants on the same Q/K/V and compares each against exact fp64 attention:
- kernel variants ("fp16", "fp8" PV, or "fp32" = QK quantization only) through the reference,
  i.e. exactly the numerics the Triton kernels implement, with any bits/granularity/blocks;
- "int8-naive": the seed document's naive INT8 PV (normalised P on a fixed 1/127 grid, V per
  block INT8), which shows why P·V needs 16-bit or FP8.

Inputs: a synthetic preset (`presets.py`) or a safetensors file of captured Q/K/V: tensors named
`q`, `k`, `v` (one layer) or `<layer>.q`, `<layer>.k`, `<layer>.v` (several layers), each
(B, H, N, D) in HND layout, or NHD with layout="NHD".
Figures: cosine / relative L1 / RMSE per head, worst and mean, worst layer by name, and whether the
variant meets the accuracy contract's floors for its P·V mode (`floors.CONTRACT`).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from sagevideo.attention.accuracy import ErrorStats, attention_fp64, error_stats, per_slice_errors
from sagevideo.eval.numerics.floors import contract_for
from sagevideo.eval.numerics.presets import make_inputs
from sagevideo.kernels.plans import tiles
from sagevideo.kernels.reference import quantize_symmetric, sageattn_reference, smoothed_k

SIM_PV_MODES = ("fp16", "fp8", "fp32", "int8-naive")
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


@dataclass(frozen=True)
class Variant:
    """One simulated attention configuration."""

    pv: str = "fp16"
    smooth_k: bool = True
    rotate_qk: bool = True
    qk_bits: int = 8
    granularity: str = "block"
    block_m: int | None = None  # None: the kernel plan's tiles for this PV mode
    block_n: int | None = None

    head_dim: int = 128  # selects the plan's default tiles

    def tiles(self) -> tuple[int, int]:
        default_m, default_n = tiles("fp8" if self.pv == "fp8" else "fp16", self.head_dim)
        return self.block_m or default_m, self.block_n or default_n

    @property
    def label(self) -> str:
        bm, bn = self.tiles()
        gran = f"block{bm}/{bn}" if self.granularity == "block" else "token"
        return (f"int{self.qk_bits} {gran} smooth_k={'on' if self.smooth_k else 'off'} "
                f"rotate={'on' if self.rotate_qk else 'off'} pv={self.pv}")


@dataclass
class LayerResult:
    layer: str
    stats: ErrorStats
    worst_head: tuple[int, int]  # (batch, head) of the lowest cosine


@dataclass
class VariantResult:
    variant: Variant
    layers: list[LayerResult] = field(default_factory=list)

    @property
    def worst_layer(self) -> LayerResult:
        return min(self.layers, key=lambda r: r.stats.cos_worst)

    def summary(self) -> dict[str, float | str]:
        """Worst over layers and heads; means over layers of per-layer means."""
        worst = self.worst_layer
        n = len(self.layers)
        return {
            "variant": self.variant.label,
            "cos_worst": worst.stats.cos_worst,
            "cos_mean": sum(r.stats.cos_mean for r in self.layers) / n,
            "rel_l1_worst": max(r.stats.rel_l1_worst for r in self.layers),
            "rel_l1_mean": sum(r.stats.rel_l1_mean for r in self.layers) / n,
            "rmse_worst": max(r.stats.rmse_worst for r in self.layers),
            "rmse_mean": sum(r.stats.rmse_mean for r in self.layers) / n,
            "worst_layer": worst.layer,
            "worst_head": f"b{worst.worst_head[0]}h{worst.worst_head[1]}",
            "nonfinite": sum(r.stats.nonfinite for r in self.layers),
        } | {"contract": self.contract_verdict()}

    def contract_verdict(self) -> str:
        """"meets", "short: <what misses>" against the accuracy contract's floors of this P·V mode
        (`floors.CONTRACT`, worst over layers, mean over layers), or "-" where it has none."""
        floors = contract_for(self.variant.pv)
        if floors is None:
            return "-"
        n = len(self.layers)
        stats = {"cos_worst": self.worst_layer.stats.cos_worst,
                 "cos_mean": sum(r.stats.cos_mean for r in self.layers) / n,
                 "rel_l1_worst": max(r.stats.rel_l1_worst for r in self.layers)}
        misses = floors.misses(stats)
        return "short: " + ", ".join(misses) if misses else "meets"


def naive_int8_pv_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, variant: Variant, key_mask: torch.Tensor | None = None
) -> torch.Tensor:
    """The seed document's naive INT8 PV: fake-quantized Q/K (as the kernels do), full softmax,
    P rounded on a fixed 1/127 grid, V quantized per key block to INT8. fp32 (B, H, Nq, D)."""
    bm, bn = variant.tiles()
    valid = None if key_mask is None else key_mask.to(torch.bool)
    ks = smoothed_k(k, valid)[0] if variant.smooth_k else k.float()
    group_q, group_k = (bm, bn) if variant.granularity == "block" else (1, 1)
    q_codes, q_scale = quantize_symmetric(q.float(), group_q, variant.qk_bits)
    k_codes, k_scale = quantize_symmetric(ks, group_k, variant.qk_bits)
    s = ((q_codes * q_scale[..., None]) @ (k_codes * k_scale[..., None]).transpose(-1, -2)) * q.shape[-1] ** -0.5
    if valid is not None:
        s = s.masked_fill(~valid[:, None, None, :], float("-inf"))
    p = torch.softmax(s, dim=-1)
    p_q = torch.round(p * 127).clamp(0, 127) / 127
    v_codes, v_scale = quantize_symmetric(v.float(), bn, 8)
    return p_q @ (v_codes * v_scale[..., None])


def run_variant(q, k, v, variant: Variant, key_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Attention output of `variant` on HND inputs."""
    if variant.pv not in SIM_PV_MODES:
        raise ValueError(f"pv={variant.pv!r} is not one of {SIM_PV_MODES}")
    if variant.pv == "int8-naive":
        return naive_int8_pv_attention(q, k, v, variant, key_mask)
    bm, bn = variant.tiles()
    out, _ = sageattn_reference(
        q, k, v, sm_scale=q.shape[-1] ** -0.5, block_m=bm, block_n=bn, key_mask=key_mask,
        qk_granularity=variant.granularity, pv=variant.pv, smooth_k=variant.smooth_k,
        rotate_qk=variant.rotate_qk, qk_bits=variant.qk_bits,
    )
    return out


def evaluate_layer(name: str, q, k, v, variant: Variant, key_mask=None, ref=None) -> LayerResult:
    ref = attention_fp64(q, k, v, key_mask=key_mask) if ref is None else ref
    out = run_variant(q, k, v, variant, key_mask)
    cos = torch.nan_to_num(per_slice_errors(ref, out)["cos"], nan=-1.0)
    flat = int(cos.argmin())
    return LayerResult(name, error_stats(ref, out), divmod(flat, cos.shape[1]))


def qkv_file_shapes(path: str | Path, layout: str = "HND") -> dict[str, tuple[int, int, int, int]]:
    """{layer: (B, H, N, D)} of a captured Q/K/V file, read from its header only (no tensor data).

    Raises ValueError naming the problem: not a safetensors file, tensors not named q/k/v or
    <layer>.q/.k/.v, a layer without all three, tensors that are not 4-D."""
    from safetensors import SafetensorError, safe_open

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no such file: {path} (expected a .safetensors file with q/k/v tensors)")
    if layout not in ("HND", "NHD"):
        raise ValueError(f"layout={layout!r}: use 'HND' or 'NHD'")
    try:
        with safe_open(str(path), framework="pt") as f:
            shapes = {key: tuple(f.get_slice(key).get_shape()) for key in f.keys()}
    except (SafetensorError, OSError) as err:
        raise ValueError(
            f"{path}: not a readable safetensors file ({err}); give one written by "
            "`sagevideo calibrate --save-qkv` or safetensors.torch.save_file"
        ) from None
    layers: dict[str, dict[str, tuple[int, ...]]] = {}
    for key, shape in shapes.items():
        prefix, _, role = key.rpartition(".")
        if role not in ("q", "k", "v"):
            raise ValueError(f"{path}: tensor {key!r} is not named q, k, v or <layer>.q/.k/.v")
        layers.setdefault(prefix or "attention", {})[role] = shape
    if not layers:
        raise ValueError(f"{path}: holds no tensors; expected q, k, v (or <layer>.q/.k/.v)")
    out = {}
    for name, parts in layers.items():
        missing = {"q", "k", "v"} - parts.keys()
        if missing:
            raise ValueError(f"{path}: layer {name!r} lacks {sorted(missing)}")
        if any(len(parts[r]) != 4 for r in "qkv"):
            raise ValueError(f"{path}: layer {name!r}: q/k/v must be 4-D (B, H, N, D) in {layout} layout")
        b, x, y, d = parts["q"]
        out[name] = (b, x, y, d) if layout == "HND" else (b, y, x, d)
    return out


def load_qkv_file(path: str | Path, layout: str = "HND") -> dict[str, tuple[torch.Tensor, ...]]:
    """Layers of captured Q/K/V from a safetensors file: {layer name: (q, k, v)} in HND."""
    from safetensors.torch import load_file

    names = qkv_file_shapes(path, layout)  # every problem of the file, before its data is read
    tensors = load_file(str(path))
    out = {}
    for name in names:
        prefix = "" if name == "attention" and "q" in tensors else f"{name}."
        parts = {r: tensors[f"{prefix}{r}"] for r in "qkv"}
        out[name] = tuple(parts[r] if layout == "HND" else parts[r].transpose(1, 2) for r in "qkv")
    return out


def estimate_bytes(shapes: Iterable[tuple[int, int, int, int]], variants: Iterable[Variant], dtype: str) -> int:
    """Peak memory of `simulate` on layers of these (B, H, N, D) shapes (N the longest of Q and K).

    Every layer's inputs stay in memory (fp32 as read, in `dtype`, and fp64 copies), and one layer
    at a time holds the exact fp64 reference's B·H·N² scores twice (scores and softmax); the
    naive INT8 PV variant holds three fp32 N² matrices."""
    shapes = list(shapes)
    width = torch.finfo(DTYPES[dtype]).bits // 8
    inputs = sum(3 * b * h * n * d * (4 + width + 8) + b * h * n * d * 8 for b, h, n, d in shapes)
    naive = any(v.pv == "int8-naive" for v in variants)
    per_layer = max(b * h * n * n * (2 * 8 + (3 * 4 if naive else 0)) for b, h, n, d in shapes)
    return inputs + per_layer


def simulate(
    variants: Iterable[Variant],
    *,
    preset: str | None = "k-offset",
    shape: tuple[int, int, int, int] = (1, 8, 1024, 128),
    seed: int = 0,
    qkv_file: str | None = None,
    layout: str = "HND",
    dtype: str = "fp32",
    device: str = "cpu",
    progress: Callable[[str], None] | None = None,
) -> list[VariantResult]:
    """Run every variant on the inputs and return per-layer errors vs fp64 attention.

    progress(text) is called before each fp64 reference and each (variant, layer) run."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype={dtype!r}: use one of {sorted(DTYPES)}")
    if qkv_file is not None:
        layers = {n: (*t, None) for n, t in load_qkv_file(qkv_file, layout).items()}
    else:
        x = make_inputs(preset, shape, seed)
        layers = {preset: (x.q, x.k, x.v, x.key_mask)}
    prepared = {}
    for name, (q, k, v, mask) in layers.items():
        if progress is not None:
            progress(f"fp64 reference: {name}")
        q, k, v = (t.to(device=device, dtype=DTYPES[dtype]) for t in (q, k, v))
        mask = None if mask is None else mask.to(device)
        prepared[name] = (q, k, v, mask, attention_fp64(q, k, v, key_mask=mask))
    head_dim = next(iter(prepared.values()))[0].shape[-1]
    results = []
    for variant in variants:
        variant = dataclasses.replace(variant, head_dim=head_dim)  # default tiles follow the plan
        result = VariantResult(variant)
        for name, (q, k, v, mask, ref) in prepared.items():
            if progress is not None:
                progress(f"{variant.label}: {name}")
            result.layers.append(evaluate_layer(name, q, k, v, variant, mask, ref))
        results.append(result)
    return results


def variant_grid(
    pv: Iterable[str], smooth_k: Iterable[bool], rotate_qk: Iterable[bool], **common
) -> list[Variant]:
    """Every combination of the listed PV modes, smoothing and rotation settings."""
    return [Variant(pv=p, smooth_k=s, rotate_qk=r, **common) for p, s, r in itertools.product(pv, smooth_k, rotate_qk)]


def format_table(results: list[VariantResult]) -> str:
    """A plain-text table, one row per variant, worst before mean."""
    header = (f"{'variant':58s} {'cos worst':>10s} {'cos mean':>9s} {'relL1 worst':>11s} {'relL1 mean':>10s} "
              f"{'RMSE worst':>10s}  {'worst at':24s} contract")
    lines = [header, "-" * len(header)]
    for r in results:
        s = r.summary()
        lines.append(
            f"{s['variant']:58s} {s['cos_worst']:10.5f} {s['cos_mean']:9.5f} {s['rel_l1_worst']:11.4f} "
            f"{s['rel_l1_mean']:10.4f} {s['rmse_worst']:10.2e}  {s['worst_layer'] + ' ' + s['worst_head']:24s} "
            f"{s['contract']}"
            + (f"  NONFINITE={s['nonfinite']}" if s["nonfinite"] else "")
        )
    return "\n".join(lines)
