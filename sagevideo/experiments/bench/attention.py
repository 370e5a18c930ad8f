"""`sagevideo bench attention`: attention calls at given shapes, SDPA's backends and sagevideo's
`sageattn` side by side in one run.

Arms: SDPA pinned to one backend each (cuDNN, flash, efficient, math on a GPU; math on the CPU)
and `sageattn` per P·V mode, as users call it (quantization included; the backend that ran is
read from `sagevideo.last_backend()`). Each arm is timed in round-robin rounds (`bench.timing`),
the median reported, with TOPS = 4·B·H·Nq·Nk·D / time and ratios (> 1: faster) against the best
SDPA arm and against cuDNN. Accuracy: every arm's output against fp32 SDPA, worst cosine over
(batch, head). Inputs: random, seed 0, channel 7 of K offset by +8 (real K has such channels;
without one, K smoothing would be untested).

Shapes come as text ("2x48x17776x64": B x H x N x D, or B x H x Nq x Nk x D) or from a model
config (`pipelines.forwards.attention_calls`: the calls one denoising step really makes).

Block-sparse arms (`--density D`, docs/sparse.md): `sageattn(tile_mask=...)` per P·V mode at that
density, and flashinfer's block-sparse attention where it is installed (a GPU; its mask takes whole
128-token blocks, so Nq and Nk must be multiples of 128: Wan 720p's 75,600 is not), on one tile mask
of 128x128 tiles shared by every head (flashinfer's BSR mask is one for all heads): each query tile
keeps its diagonal tile and random others, the same number per row. Random tiles give the kernels no
locality that real selections (3-D windows) would: a conservative mask for timing. With
`--static-grid FxHxW` the mask is instead the static 3-D window on that latent grid closest to the
density (`attention.sparse.static_mask` in 128x128 tiles, raster token order, the first key
tile kept as a sink), as installed models' static plans select: windows give the per-row lengths
and the neighbours' shared key tiles that the kernel's schedule meets in a model (arms named
`...-dD-static`). Their accuracy is
against exact (fp64) attention restricted to the same mask; `x_dense` compares with the dense arm of the same
P·V mode.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator

from sagevideo.choices import PV, DType, has_fp8_tensor_cores
from sagevideo.errors import InputError
from sagevideo.experiments.bench.timing import (
    BenchOptions,
    BenchReport,
    ModelSizeOptions,
    cosine_worst,
    interleaved,
    machine,
    median,
    median_ms,
    now,
    resolve_device_dtype,
)

SCHEMA = "sagevideo.bench.attention"
SDPABackendName = Literal["cudnn", "flash", "efficient", "math"]
SDPA_ON = {"cuda": ("cudnn", "flash", "efficient", "math"), "cpu": ("math",)}
SageBackend = Literal["auto", "triton", "reference"]
MATH_SCORES_LIMIT = 4 << 30  # bytes of fp32 scores past which SDPA's math backend is not run on a GPU
SPARSE_TILE = 128  # block-sparse arms' mask tiles: a multiple of every kernel plan's (64, 128); flashinfer's R, C


@dataclass(frozen=True)
class AttentionShape:
    """q (batch, heads, n_q, head_dim), k/v (batch, heads, n_k, head_dim)."""

    batch: int
    heads: int
    n_q: int
    n_k: int
    head_dim: int

    @property
    def label(self) -> str:
        tokens = [self.n_q] if self.n_q == self.n_k else [self.n_q, self.n_k]
        return "x".join(map(str, (self.batch, self.heads, *tokens, self.head_dim)))

    @property
    def flops(self) -> float:
        """Non-causal attention's multiply-adds x 2: Q·Kᵀ and P·V."""
        return 4.0 * self.batch * self.heads * self.n_q * self.n_k * self.head_dim


def parse_shape(text: str) -> AttentionShape:
    """"2x48x17776x64" (B x H x N x D) or "1x40x75600x512x128" (B x H x Nq x Nk x D)."""
    dims = _sizes(text)
    if len(dims) not in (4, 5) or min(dims) < 1:
        raise ValueError(f"{text!r}: not BxHxNxD or BxHxNqxNkxD with positive sizes, e.g. 2x48x17776x64")
    b, h, *tokens, d = dims
    return AttentionShape(b, h, tokens[0], tokens[-1], d)


def parse_grid(text: str) -> tuple[int, int, int]:
    """"21x45x80" -> (frames, height, width) of a latent grid; ValueError otherwise."""
    dims = _sizes(text)
    if len(dims) != 3 or min(dims) < 1:
        raise ValueError(f"{text!r} is not a latent grid FxHxW of positive sizes, e.g. 21x45x80")
    return dims[0], dims[1], dims[2]


def _sizes(text: str) -> list[int]:
    """The integers of "AxBx...", [] where a part is not one."""
    try:
        return [int(part) for part in text.lower().split("x")]
    except ValueError:
        return []


def tops(flops: float, ms: float | None) -> float | None:
    return None if not ms else flops / (ms * 1e-3) / 1e12


class BenchAttentionConfig(BenchOptions, ModelSizeOptions):
    """What to time: shapes (text) and/or a model config's attention calls, on which device."""

    shapes: list[str] = Field([], description="attention shape BxHxNxD (or BxHxNqxNkxD), e.g. 2x48x17776x64; "
                              "repeatable")
    model: str | None = Field(None, description="time the attention calls of one denoising step of this "
                              "transformer config (cogvideox-5b, wan-14b, ...; tiny-* on the CPU)")
    pv: list[PV] | None = Field(None, description="sageattn P·V modes (repeatable; default fp16, and fp8 on "
                                "GPUs with FP8 tensor cores)")
    backend: SageBackend = Field("auto", description="sageattn backend (auto: triton on a GPU, reference on the CPU)")
    sdpa: list[SDPABackendName] | None = Field(None, description="SDPA backends to time (repeatable; default: "
                                               "cudnn, flash, efficient, math on a GPU, math on the CPU)")
    dtype: DType | None = Field(None, description="inputs' dtype (default bfloat16 on a GPU, float32 on the CPU)")
    density: list[float] = Field([], description="also time block-sparse attention at this density of 128x128 "
                                 "key tiles kept per query tile (0 < D < 1; repeatable): sageattn per P·V mode, and "
                                 "flashinfer's block-sparse kernel on the same mask where it is installed (and Nq, "
                                 "Nk are multiples of 128: its mask takes whole blocks)")
    static_grid: str | None = Field(None, description="latent grid FxHxW, e.g. 21x45x80: the --density arms keep "
                                    "the static 3-D window on it closest to each density (tokens in raster order, "
                                    "as installed models run them) instead of random tiles; every shape's Nq and "
                                    "Nk must be F*H*W")
    reps: int = Field(3, ge=1, description="round-robin rounds per arm (median reported)")
    budget_ms: float = Field(100.0, gt=0, description="time spent per arm and round (calls timed one by one)")

    @field_validator("density")
    @classmethod
    def _fraction(cls, value: list[float]) -> list[float]:
        bad = [d for d in value if not 0 < d < 1]
        if bad:
            raise ValueError(f"{bad[0]:g} is not a fraction of the key tiles between 0 and 1 (1 is the dense arm)")
        return sorted(set(value))

    @field_validator("static_grid")
    @classmethod
    def _grid(cls, value: str | None) -> str | None:
        if value is not None:
            parse_grid(value)
        return value

    @field_validator("model")
    @classmethod
    def _known_model(cls, value: str | None) -> str | None:
        from sagevideo.pipelines.forwards import known_config

        return None if value is None else known_config(value)


@dataclass
class AttentionBenchPlan:
    """A config resolved against this machine: every check done, nothing run yet."""

    device: str
    dtype: str
    backend: str
    pv: list[str]
    sdpa: list[str]
    shapes: list[tuple[AttentionShape, int | None, bool]]  # (shape, calls per step, masked in the model)
    estimate_s: float | None = None  # the run's time here (`run_budget`; None: not estimated, a GPU or small)
    densities: tuple[float, ...] = ()  # block-sparse arms (fractions of the key tiles kept)
    static_grid: tuple[int, int, int] | None = None  # their masks: static windows on this grid, else random tiles


def resolve(config: BenchAttentionConfig) -> AttentionBenchPlan:
    """Check `config` on this machine; raises InputError (a shape that does not parse, a bad device,
    a sageattn backend or P·V mode that cannot run a shape, a run that cannot fit in memory or would
    take longer than --max-hours here: `run_budget`) before any tensor is made."""
    import torch

    from sagevideo.attention.backends import AttentionCall, problem
    from sagevideo.outputs.files import writable_file

    if not config.shapes and config.model is None:
        raise InputError("nothing to time: give --shape BxHxNxD (repeatable) or --model NAME")
    bad = [problem for problem in [config.size_problem(config.model)] if problem]
    for text in config.shapes:
        try:
            parse_shape(text)
        except ValueError as err:
            bad.append(f"--shape {err}")
    if bad:
        raise InputError("\n".join(bad))
    if config.json_out is not None:
        writable_file(config.json_out, "--json", InputError, "bench.json")
    if config.append_results is not None:
        writable_file(config.append_results, "--append-results", InputError, "results.jsonl")
    device, dtype = resolve_device_dtype(config.device, config.dtype)
    backend = config.backend if config.backend != "auto" or device == "cuda" else "reference"
    pv = list(config.pv or (["fp16", "fp8"] if has_fp8_tensor_cores(device) else ["fp16"]))
    sdpa = list(config.sdpa or SDPA_ON[device])
    if device == "cpu" and set(sdpa) - set(SDPA_ON["cpu"]):
        raise InputError(f"--sdpa {', '.join(sorted(set(sdpa) - {'math'}))}: on the CPU only SDPA's math backend "
                         "is timed")
    shapes: list[tuple[AttentionShape, int | None, bool]] = [(parse_shape(t), None, False) for t in config.shapes]
    names = [f"--shape {shape.label}" for shape, _, _ in shapes]
    if config.model is not None:
        from sagevideo.pipelines.forwards import attention_calls

        for call in attention_calls(config.model, **config.size()):
            shape = AttentionShape(call.batch, call.heads, call.n_q, call.n_k, call.head_dim)
            shapes.append((shape, call.calls, call.masked))
            names.append(f"--model {config.model}'s attention call {shape.label}")
    grid = _static_grid(config, [shape for shape, _, _ in shapes], names)
    if backend != "auto":  # "auto" never refuses: a fallback is run and recorded as what ran
        for shape, _, _ in shapes:
            for mode in pv:
                call = AttentionCall(torch.device(device), getattr(torch, dtype), shape.head_dim, pv=mode,
                                     n_k=shape.n_k)
                reason = problem(backend, call)
                if reason:
                    raise InputError(f"--backend {backend} --pv {mode} at {shape.label} ({dtype}): {reason}")
    from sagevideo.experiments.run_budget import Arm, check_attention_run

    arms = [Arm(f"sdpa-{name}", sdpa=name) for name in sdpa] + [Arm(f"sagevideo-{m}", backend, pv=m) for m in pv]
    estimate = check_attention_run([shape for shape, _, _ in shapes], arms, device, dtype, reps=config.reps,
                                   max_hours=config.max_hours, names=names)
    return AttentionBenchPlan(device, dtype, backend, pv, sdpa, shapes, estimate.seconds, tuple(config.density),
                              grid)


def _static_grid(config: BenchAttentionConfig, shapes: list[AttentionShape],
                 names: list[str]) -> tuple[int, int, int] | None:
    """--static-grid as (frames, height, width), None when not given; InputError without --density
    or where a shape is not a self-attention over the grid's tokens."""
    if config.static_grid is None:
        return None
    grid = parse_grid(config.static_grid)
    if not config.density:
        raise InputError("--static-grid: shapes the --density arms' masks; give --density D too, e.g. 0.15")
    tokens = grid[0] * grid[1] * grid[2]
    for shape, name in zip(shapes, names, strict=True):
        if shape.n_q != tokens or shape.n_k != tokens:
            raise InputError(f"--static-grid {config.static_grid} ({tokens} tokens) does not match {name}: its "
                             "queries and keys must both be the grid's tokens (a self-attention over the latent video)")
    return grid


class ArmResult(BaseModel):
    """One arm at one shape. ran: the SDPA backend it was pinned to, or the sageattn backend label
    that ran ("triton/fp8", "reference/fp16", "sdpa" after a fallback); ms: median of reps_ms;
    x_best_sdpa / x_cudnn: that arm's median ms / this one's (> 1: faster); note: an error, a
    fallback's reason, or why the arm was not run. Block-sparse arms: density (key tiles kept /
    all, the mask's; their TOPS count the kept tiles' work), x_dense (the dense sagevideo arm of the
    same P·V mode's ms / this one's)."""

    name: str
    ran: str | None = None
    ms: float | None = None
    reps_ms: list[float] = []
    tops: float | None = None
    x_best_sdpa: float | None = None
    x_cudnn: float | None = None
    cos_worst: float | None = None
    density: float | None = None
    x_dense: float | None = None
    note: str = ""


class ShapeResult(BaseModel):
    """Every arm at one shape; calls: how often one denoising step makes this call (model shapes);
    masked: the model calls it with a mask (timed without one)."""

    label: str
    batch: int
    heads: int
    n_q: int
    n_k: int
    head_dim: int
    calls: int | None = None
    masked: bool = False
    best_sdpa: str | None = None
    arms: list[ArmResult]

    def arm(self, name: str) -> ArmResult:
        return next(a for a in self.arms if a.name == name)


class AttentionBenchReport(BenchReport):
    schema_: str = Field(SCHEMA, alias="schema")
    model: str | None = None
    backend: str
    reps: int
    shapes: list[ShapeResult]

    def table(self) -> str:
        """One line per arm, shapes one after another."""
        head = (f"{'shape':22s} {'arm':22s} {'ms':>10s} {'TOPS':>7s} {'x best SDPA':>12s} {'x cuDNN':>8s} "
                f"{'x dense':>8s} {'cos worst':>10s}  ran")
        lines = [f"attention on {self.machine['device_name']} ({self.device}, {self.dtype}), median of {self.reps} "
                 "round-robin rounds; x: that time / this one (> 1: faster)", head]
        for shape in self.shapes:
            label = shape.label + (f" x{shape.calls}" if shape.calls else "")
            for arm in shape.arms:
                lines.append(f"{label:22s} {arm.name:22s} {_num(arm.ms, '10.3f')} {_num(arm.tops, '7.2f')} "
                             f"{_num(arm.x_best_sdpa, '12.2f')} {_num(arm.x_cudnn, '8.2f')} "
                             f"{_num(arm.x_dense, '8.2f')} {_num(arm.cos_worst, '10.5f')}  {arm.ran or '-'}"
                             + (f"  ({arm.note})" if arm.note else ""))
                label = ""
        return "\n".join(lines)

    def result_rows(self, run: Any) -> None:
        """Per shape (its label) and arm (variant: its name): ms, tops, x_best_sdpa, x_cudnn and
        cos_worst rows (what ran, the rounds and any note in the ms row's extra)."""
        for shape in self.shapes:
            for arm in shape.arms:
                run.add(shape.label, arm.name, "ms", arm.ms, ran=arm.ran, reps_ms=arm.reps_ms, note=arm.note or None,
                        calls=shape.calls)
                for metric in ("tops", "x_best_sdpa", "x_cudnn", "x_dense", "density", "cos_worst"):
                    run.add(shape.label, arm.name, metric, getattr(arm, metric))

    def summary(self) -> str:
        """Per shape: the fastest dense sageattn arm against the best SDPA arm."""
        parts = []
        for shape in self.shapes:
            sage = [a for a in shape.arms if a.name.startswith("sagevideo-") and a.ms and a.density is None]
            if not sage or shape.best_sdpa is None:
                parts.append(f"{shape.label}: no sagevideo/SDPA pair measured")
                continue
            best = min(sage, key=lambda a: a.ms or 0.0)
            parts.append(f"{shape.label}: {best.name} ({best.ran}) {best.x_best_sdpa:.2f}x {shape.best_sdpa}")
        return "; ".join(parts)


def _num(value: float | None, fmt: str) -> str:
    return f"{'-':>{int(fmt.split('.')[0])}s}" if value is None else format(value, fmt)


# --- the arms ------------------------------------------------------------------------------------


def attention_inputs(shape: AttentionShape, device: str, dtype: Any, seed: int = 0) -> tuple[Any, Any, Any]:
    """q (B, H, Nq, D), k and v (B, H, Nk, D) in `dtype` on `device`, standard normal from `seed`,
    channel 7 of K offset by +8 (never all zeros; K smoothing matters)."""
    import torch

    gen = torch.Generator(device).manual_seed(seed)
    b, h, d = shape.batch, shape.heads, shape.head_dim
    q = torch.randn(b, h, shape.n_q, d, device=device, dtype=dtype, generator=gen)
    k, v = (torch.randn(b, h, shape.n_k, d, device=device, dtype=dtype, generator=gen) for _ in range(2))
    k[..., 7 % d] += 8.0
    return q, k, v


def sdpa_call(backend: str, q: Any, k: Any, v: Any) -> Callable[[], Any]:
    """SDPA on q, k, v (B, H, N, D) pinned to one backend: "cudnn", "flash", "efficient", "math"."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    chosen = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
              "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}[backend]

    def run():
        with sdpa_kernel([chosen]):
            return F.scaled_dot_product_attention(q, k, v)

    return run


def reference_fp32(q: Any, k: Any, v: Any) -> Any:
    """fp32 SDPA of q, k, v (B, H, N, D), one head at a time to bound memory: (B, H, Nq, D) fp32."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    out = torch.empty(q.shape, device=q.device, dtype=torch.float32)
    with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]):
        for h in range(q.shape[1]):
            out[:, h : h + 1] = F.scaled_dot_product_attention(
                q[:, h : h + 1].float(), k[:, h : h + 1].float(), v[:, h : h + 1].float()
            )
    return out


def random_tile_mask(shape: AttentionShape, density: float, device: str, seed: int = 0) -> Any:
    """A `TileMask` of SPARSE_TILE x SPARSE_TILE tiles for `shape`, one for every batch row and head:
    each query tile keeps max(1, round(density x key tiles)) tiles, its diagonal one (query tile i's
    key tile i, the last where there are fewer key tiles) and random others (seeded)."""
    import torch

    from sagevideo.attention.sparse import TileMask

    m_tiles, n_tiles = (-(-n // SPARSE_TILE) for n in (shape.n_q, shape.n_k))
    keep_per_row = max(1, round(density * n_tiles))
    gen = torch.Generator().manual_seed(seed)
    scores = torch.rand(m_tiles, n_tiles, generator=gen)
    diagonal = torch.arange(m_tiles).clamp(max=n_tiles - 1)
    scores[torch.arange(m_tiles), diagonal] = 2.0  # above every random score: always kept
    keep = torch.zeros(m_tiles, n_tiles, dtype=torch.bool)
    keep.scatter_(1, scores.topk(keep_per_row, dim=1).indices, True)
    return TileMask(keep[None, None].to(device), SPARSE_TILE, SPARSE_TILE, shape.n_q, shape.n_k)


def flashinfer_block_sparse(q: Any, k: Any, v: Any, tile_mask: Any) -> Callable[[], Any]:
    """flashinfer's block-sparse attention (BlockSparseAttentionWrapper) on q, k, v (1, H, N, D) with
    `tile_mask` (one for all heads) as its BSR mask of block_m x block_n blocks; planned here, once.
    ImportError where flashinfer is not installed."""
    import inspect

    import flashinfer
    import torch

    if q.shape[0] != 1:
        raise ValueError("flashinfer's block-sparse arm takes batch 1")
    # its BSR layout reshapes q and k into whole blocks: a partial last tile fails deep inside it
    for name, n, block in (("Nq", q.shape[2], tile_mask.block_m), ("Nk", k.shape[2], tile_mask.block_n)):
        if n % block:
            raise ValueError(f"flashinfer's BSR mask needs {name} a multiple of its {block}-token blocks ({n} is not; "
                             f"e.g. {-(-n // block) * block})")
    keep = tile_mask.keep[0, 0]
    indptr = torch.cat([keep.new_zeros(1, dtype=torch.int32), keep.sum(dim=1).cumsum(0).to(torch.int32)])
    indices = keep.nonzero()[:, 1].to(torch.int32)  # row-major: each row's kept key tiles, ascending
    workspace = torch.empty(128 << 20, dtype=torch.uint8, device=q.device)
    wrapper = flashinfer.BlockSparseAttentionWrapper(workspace)
    # its output dtype defaults to fp16 whatever the inputs' (0.7.x), so it is named where it is taken
    output = {"o_data_type": q.dtype} if "o_data_type" in inspect.signature(wrapper.plan).parameters else {}
    wrapper.plan(indptr, indices, q.shape[2], k.shape[2], tile_mask.block_m, tile_mask.block_n, q.shape[1],
                 k.shape[1], q.shape[3], q_data_type=q.dtype, kv_data_type=k.dtype, **output)
    qn, kn, vn = (t[0].transpose(0, 1).contiguous() for t in (q, k, v))  # (N, H, D): its NHD layout

    def run():
        return wrapper.run(qn, kn, vn).transpose(0, 1)[None]

    return run


def _sparse_arms(shape: AttentionShape, plan: AttentionBenchPlan, q: Any, k: Any, v: Any,
                 arms: dict[str, Callable[[], Any]], results: dict[str, ArmResult]) -> dict[str, Any]:
    """Add the block-sparse arms of `plan.densities` to `arms`/`results`; returns each arm's
    reference (exact attention restricted to its mask, `masked_attention_exact`)."""
    from sagevideo import sageattn
    from sagevideo.attention.sparse import masked_attention_exact, static_mask

    references = {}
    kind = "-static" if plan.static_grid else ""
    for density in plan.densities:
        if plan.static_grid:
            mask = static_mask(plan.static_grid, density, block_m=SPARSE_TILE, block_n=SPARSE_TILE,
                               device=plan.device)
        else:
            mask = random_tile_mask(shape, density, plan.device)
        reference = masked_attention_exact(q, k, v, mask)
        for pv in plan.pv:
            name = f"sagevideo-{pv}-d{density:g}{kind}"

            def call(pv=pv, mask=mask):
                return sageattn(q, k, v, pv=pv, backend=plan.backend, tile_mask=mask)

            arms[name], references[name] = call, reference
            results[name] = ArmResult(name=name, density=mask.density)
        name = f"flashinfer-d{density:g}{kind}"
        results[name] = ArmResult(name=name, ran="flashinfer", density=mask.density)
        try:
            arms[name], references[name] = flashinfer_block_sparse(q, k, v, mask), reference
        except Exception as exc:  # noqa: BLE001 - not installed, or it refuses the shape: said in the row
            results[name].note = f"not run: {(str(exc).splitlines() or [type(exc).__name__])[0]}"
    return references


def bench_shape(shape: AttentionShape, plan: AttentionBenchPlan, reps: int, budget_ms: float,
                measure: Callable[[Callable[[], Any]], float] | None = None,
                tick: Callable[[], Any] | None = None) -> ShapeResult:
    """Every arm of `plan` at `shape`, timed round-robin (`measure(fn)` -> ms: `median_ms` by default);
    tick(), if given, after the reference and each arm's call and measurement (a progress bar)."""
    import torch

    from sagevideo import last_backend, sageattn

    tick = tick or (lambda: None)
    q, k, v = attention_inputs(shape, plan.device, getattr(torch, plan.dtype))
    reference = reference_fp32(q, k, v)
    tick()
    arms: dict[str, Callable[[], Any]] = {}
    results: dict[str, ArmResult] = {}
    for backend in plan.sdpa:
        name = f"sdpa-{backend}"
        scores = 4 * shape.batch * shape.heads * shape.n_q * shape.n_k
        if backend == "math" and plan.device == "cuda" and scores > MATH_SCORES_LIMIT:
            results[name] = ArmResult(name=name, ran=backend, note=f"not run: its fp32 scores would take "
                                      f"{scores / 2**30:.0f} GiB")
            continue
        arms[name], results[name] = sdpa_call(backend, q, k, v), ArmResult(name=name, ran=backend)
    for pv in plan.pv:
        name = f"sagevideo-{pv}"

        def call(pv=pv):
            return sageattn(q, k, v, pv=pv, backend=plan.backend)

        arms[name] = call
        results[name] = ArmResult(name=name)
    references = _sparse_arms(shape, plan, q, k, v, arms, results)
    for name, fn in list(arms.items()):  # one untimed call each: the accuracy, and what sageattn ran
        try:
            out = fn()
        except RuntimeError as exc:
            results[name].note = (str(exc).splitlines() or [type(exc).__name__])[0]
            del arms[name]
            continue
        if name.startswith("sagevideo-"):
            choice = last_backend()
            results[name].ran, results[name].note = choice.label, choice.reason
        results[name].cos_worst = cosine_worst(references.get(name, reference), out)
        del out
        tick()
    del reference, references
    timer = measure or (lambda fn: median_ms(fn, plan.device, budget_ms))

    def measured(fn: Callable[[], Any]) -> float:
        try:
            return timer(fn)
        finally:
            tick()

    runs, errors = interleaved(arms, reps, measured)
    for name, result in results.items():
        if name in runs:
            result.reps_ms, result.ms = runs[name], median(runs[name])
            result.tops = tops(shape.flops * (result.density or 1.0), result.ms)  # block-sparse: the work done
        elif name in errors:
            result.note = errors[name]
    sdpa = {name: r.ms for name, r in results.items() if name.startswith("sdpa-") and r.ms}
    best = min(sdpa, key=sdpa.get) if sdpa else None
    cudnn = results.get("sdpa-cudnn")
    for name, result in results.items():
        if result.ms:
            result.x_best_sdpa = sdpa[best] / result.ms if best else None
            result.x_cudnn = cudnn.ms / result.ms if cudnn and cudnn.ms else None
            dense = results.get(name.rsplit("-d", 1)[0]) if result.density is not None else None
            result.x_dense = dense.ms / result.ms if dense is not None and dense.ms else None
    return ShapeResult(label=shape.label, batch=shape.batch, heads=shape.heads, n_q=shape.n_q, n_k=shape.n_k,
                       head_dim=shape.head_dim, best_sdpa=best, arms=list(results.values()))


def run_bench_attention(config: BenchAttentionConfig, progress: Callable[[str], None] | None = None,
                        plan: AttentionBenchPlan | None = None) -> AttentionBenchReport:
    """Resolve `config` (unless `plan` is given), time every shape, write the JSON if asked."""
    import sys

    from tqdm.auto import tqdm

    from sagevideo.experiments.run_budget import LONG_S

    plan = plan or resolve(config)
    rows = []
    arms = len(plan.sdpa) + len(plan.pv)
    long = plan.estimate_s is not None and plan.estimate_s > LONG_S  # minutes of CPU work: a bar with its ETA
    with tqdm(total=len(plan.shapes) * (1 + arms * (1 + config.reps)), desc="bench attention", unit="part",
              file=sys.stderr, disable=not long, dynamic_ncols=True) as bar:
        for i, (shape, calls, masked) in enumerate(plan.shapes, 1):
            if progress:
                progress(f"[{i}/{len(plan.shapes)}] {shape.label}: {arms} arms x {config.reps} rounds")
            row = bench_shape(shape, plan, config.reps, config.budget_ms, tick=bar.update)
            row.calls, row.masked = calls, masked
            rows.append(row)
    report = AttentionBenchReport(date=now(), device=plan.device, dtype=plan.dtype, machine=machine(plan.device),
                                  model=config.model, backend=plan.backend, reps=config.reps, shapes=rows)
    if config.json_out is not None:
        report.write_json(config.json_out)
    if config.append_results is not None:
        report.append_results(config.append_results, f"sagevideo bench attention {config.settings_text()}".rstrip())
    return report
