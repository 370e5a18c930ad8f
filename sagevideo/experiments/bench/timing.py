"""What `sagevideo bench attention` and `bench forward` share: the clock, the round-robin order,
the output cosines, the device and dtype they run on, and the versioned JSON report.

Timing protocol: each arm is measured `reps` times in round-robin order and the median of those
is reported. A GPU's clock drifts by several percent within a run; interleaving spreads that drift
over every arm alike, so the ratios between arms are fair even when the absolute times move.
"""

from __future__ import annotations

import json
import platform
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from typing_extensions import Self

from sagevideo.choices import resolve_device
from sagevideo.errors import InputError
from sagevideo.jobs.config import DeviceOptions

DEFAULT_DTYPES = {"cuda": "bfloat16", "cpu": "float32"}  # the models run bf16; CPU runs are tests and smoke runs


def median(values: list[float]) -> float:
    """The middle value (the upper one of an even count: always a measured value)."""
    return sorted(values)[len(values) // 2]


def resolve_device_dtype(device: str, dtype: str | None) -> tuple[str, str]:
    """("cuda" | "cpu", dtype name): device "auto" as `choices.resolve_device`; dtype None: bf16 on
    a GPU, fp32 on the CPU. Raises InputError for "cuda" without a GPU."""
    import torch

    resolved = resolve_device(device)
    if resolved == "cuda" and not torch.cuda.is_available():
        raise InputError("--device cuda: torch sees no CUDA GPU here; use --device cpu or auto")
    return resolved, dtype or DEFAULT_DTYPES[resolved]


def synchronizer(device: str) -> Callable[[], None]:
    """Waits for the device's queued work (a no-op on the CPU)."""
    import torch

    return torch.cuda.synchronize if device == "cuda" else (lambda: None)


def median_ms(fn: Callable[[], Any], device: str, budget_ms: float = 100.0) -> float:
    """Median milliseconds of one `fn()` call: a warm-up call, then as many calls as fit in about
    `budget_ms` (3 to 1000), each timed on its own (CUDA events on a GPU, the wall clock on the CPU)."""
    import torch

    sync = synchronizer(device)
    fn()
    sync()
    start = time.perf_counter()
    fn()
    sync()
    estimate_ms = (time.perf_counter() - start) * 1e3
    calls = max(3, min(1000, int(budget_ms / max(estimate_ms, 1e-3))))
    if device != "cuda":
        times = []
        for _ in range(calls):
            start = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start) * 1e3)
        return median(times)
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(calls)]
    for begin, end in events:
        begin.record()
        fn()
        end.record()
    sync()
    return median([begin.elapsed_time(end) for begin, end in events])


def interleaved(arms: dict[str, Callable[[], Any]], reps: int,
                measure: Callable[[Callable[[], Any]], float]) -> tuple[dict[str, list[float]], dict[str, str]]:
    """Measure every arm `reps` times, round-robin: ({name: its measurements}, {name: first error
    line}). An arm that raises (e.g. an SDPA backend that refuses the shape, out of memory) is
    dropped after its first error; arms with no measurement are absent from the first dict."""
    runs: dict[str, list[float]] = {name: [] for name in arms}
    errors: dict[str, str] = {}
    for _ in range(reps):
        for name, fn in arms.items():
            if name in errors:
                continue
            try:
                runs[name].append(measure(fn))
            except RuntimeError as exc:  # torch's "no available kernel" and OutOfMemoryError are RuntimeErrors
                errors[name] = (str(exc).splitlines() or [type(exc).__name__])[0]
    return {name: ms for name, ms in runs.items() if ms}, errors


def median_seconds(fn: Callable[[], Any], repeats: int, device: str) -> float:
    """Median wall-clock seconds of `repeats` calls of `fn` after one warm-up call (compile,
    autotuning), the device synchronized around each call."""
    sync = synchronizer(device)
    fn()
    sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return median(times)


def output_cosine(reference: Any, out: Any) -> float:
    """Cosine of two whole outputs (tensors of any shape), accumulated in fp64: in fp32 a sum over
    millions of elements is off by ~1e-4 (two equal CogVideoX-5B outputs, 2.2 M values, give 1.00007)."""
    import torch.nn.functional as F

    return F.cosine_similarity(reference.double().flatten(), out.double().flatten(), dim=0).item()


def cosine_worst(reference: Any, out: Any) -> float:
    """Worst cosine over (batch, head) of two (B, H, N, D) attention outputs, in fp32."""
    import torch.nn.functional as F

    return F.cosine_similarity(reference.float().flatten(2), out.float().flatten(2), dim=-1).min().item()


def machine(device: str) -> dict[str, Any]:
    """Where the figures come from: the device's name, torch, CUDA and cuDNN versions, Python."""
    import torch

    cuda = device == "cuda"
    return {
        "device_name": torch.cuda.get_device_name() if cuda else platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda if cuda else None,
        "cudnn": torch.backends.cudnn.version() if cuda else None,
        "python": platform.python_version(),
    }


class BenchOptions(DeviceOptions):
    """The options of `sagevideo bench attention`, `bench forward` and `profile` alike (with the
    shared `DeviceOptions`); `build` turns every bad one into one InputError."""

    model_config = ConfigDict(extra="forbid")
    max_hours: float = Field(1.0, ge=0, description="refuse a run estimated to take longer than this on the CPU "
                             "(0: no limit); the estimate is measured here before anything is allocated")
    append_results: Path | None = Field(None, description="also append the figures to this results file, one "
                                        "validated row per number (the schema of bench/results.jsonl; on a copy "
                                        "without .git, set BENCH_COMMIT to the commit measured)")

    def settings_text(self) -> str:
        """The options given (those not at their defaults) as key=value words, for a results row's source."""
        given = self.model_dump(exclude_defaults=True, exclude={"append_results"}, mode="json")
        return " ".join(f"{key}={','.join(map(str, v)) if isinstance(v, list) else v}" for key, v in given.items())
    json_out: Path | None = Field(None, description="write the report as JSON here")

    @classmethod
    def build(cls, **options: Any) -> Self:
        """InputError naming every bad option at once."""
        from sagevideo.jobs.problems import options_error

        try:
            return cls(**options)
        except ValidationError as err:
            raise options_error(err) from None


class ModelSizeOptions(BaseModel):
    """The video size a bench's or `sagevideo profile`'s `--model` runs at (the model config's
    default where None)."""

    frames: int | None = Field(None, ge=1, description="video frames of --model (4k + 1); default: the model's")
    resolution: str | None = Field(None, description="HEIGHTxWIDTH in pixels of --model, e.g. 480x720; "
                                   "default: the model's")

    @field_validator("resolution")
    @classmethod
    def _height_by_width(cls, value: str | None) -> str | None:
        if value is not None:
            parts = value.lower().split("x")
            if len(parts) != 2 or not all(p.strip().isdigit() and int(p) > 0 for p in parts):
                raise ValueError("use HEIGHTxWIDTH in pixels, e.g. 480x720")
        return value

    def size(self) -> dict[str, int | None]:
        """frames, height, width for `pipelines.forwards` (None: the model's)."""
        height, width = (int(p) for p in self.resolution.lower().split("x")) if self.resolution else (None, None)
        return {"frames": self.frames, "height": height, "width": width}

    def size_problem(self, model: str | None) -> str | None:
        """Why `model` cannot run at this size (frames not 4k + 1, a size the VAE cannot take), or
        None; a size without a model is a problem too."""
        if self.frames is None and self.resolution is None:
            return None
        if model is None:
            return "--frames and --resolution size a --model; give one"
        from sagevideo.pipelines.forwards import CONFIGS, latent_shape

        _, f0, h0, w0 = CONFIGS[model]
        size = self.size()
        try:
            latent_shape(size["frames"] or f0, size["height"] or h0, size["width"] or w0)
        except ValueError as err:
            return str(err)
        return None


class ModelConfigOptions(ModelSizeOptions):
    """A transformer config of `pipelines.forwards.CONFIGS` at its size: `bench forward`'s and
    `profile`'s model."""

    model: str = Field("tiny-cogvideox", description="transformer config: cogvideox-5b, wan-14b, hunyuanvideo, "
                       "opensora-768px (real size, random weights) or tiny-cogvideox|wan|hunyuanvideo|opensora")

    @field_validator("model")
    @classmethod
    def _known_model(cls, value: str) -> str:
        from sagevideo.pipelines.forwards import known_config

        return known_config(value)


class BenchReport(BaseModel):
    """The common head of both reports. schema: the report's name, version: its layout's version
    (raised when a field changes meaning or goes away)."""

    model_config = ConfigDict(populate_by_name=True)
    schema_: str = Field(alias="schema")
    version: int = 1
    date: str
    device: str
    dtype: str
    machine: dict[str, Any]

    def write_json(self, path: Path) -> None:
        path.write_text(json.dumps(self.model_dump(by_alias=True), indent=2) + "\n")

    def result_rows(self, run: Any) -> None:
        """Add this report's figures to `run` (a `results.Run`), one row per number."""
        raise NotImplementedError

    def append_results(self, path: Path, command: str) -> int:
        """Append this report's rows to the results file `path` (validated, none twice); the rows'
        source is the start time and `command`. Returns the rows written."""
        from sagevideo.experiments.bench.results import start_run

        run = start_run(self.schema_, self.machine["device_name"], command)
        self.result_rows(run)
        return run.append(path)


def now() -> str:
    """The UTC time, to the second, ISO 8601."""
    import datetime

    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
