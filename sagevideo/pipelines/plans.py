"""Attention plans: which attention runs in each transformer layer and denoising step.

A plan is frozen data (validated with pydantic, saved as JSON):

    {"version": 1,                                      # 2 when a choice is block-sparse
     "model": "CogVideoXTransformer3DModel",            # informative
     "layers": ["transformer_blocks.0.attn1", ...],     # the layers the plan was made for
     "num_steps": 50,                                   # optional: bounds for step ranges
     "default": {"mode": "int8-fp8", "granularity": "block"},
     "overrides": [{"layers": ["transformer_blocks.0.attn1"], "steps": [0, 5], "mode": "full"}],
     "recipe": {"linear": "fp8", "linear_keep": [], ...}}  # optional, informative: measured under it

`recipe` is written by `sagevideo calibrate` run with recipe options (FP8 linears change what
attention sees): the settings it measured under and a note on what it did not apply (absent: the
plain recipe).

Modes: "full" (SDPA, full precision), "int8-fp16" (INT8 QK, 16-bit PV), "int8-fp8" (INT8 QK,
FP8 PV); granularity "block" or "token" (Q/K scales per tile or per token). A quantized choice may
be block-sparse (docs/sparse.md): `"sparse": {"method": "dynamic", "density": 0.15}` (pooled Q/K
scores pick each query tile's key tiles at that share of all tiles, always keeping the diagonal
tiles, a sink tile and the text rows and columns; with `"top_p": 0.93`, which `calibrate` writes,
each query tile keeps the tiles that reach that estimated mass instead, the density staying the
target it was calibrated for) or `"method": "static"` (3-D windows on the
family's latent grid, the window whose density is closest); a "full" choice cannot be. Plans with a
sparse choice are version 2 (written so when the version is left out); version 1 plans read as
they always did. Overrides apply in order, the last match wins (the whole choice: an override
without `sparse` is dense); `steps` is a half-open range [start, stop) of denoising step
indices (stop may be null: to the end). `validate_for(layers, num_steps)` rejects unknown layer
names and out-of-range steps before anything runs.
"""

from __future__ import annotations

import json
import math
from enum import Enum
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from sagevideo.choices import SparseMethod, parse_sparse, sparse_text

READ_VERSIONS = (1, 2)  # 1: no sparse choices; 2: sparse choices allowed
SPARSE_VERSION = 2  # what a plan with a block-sparse choice is


class Mode(str, Enum):
    full = "full"
    int8_fp16 = "int8-fp16"
    int8_fp8 = "int8-fp8"

    @property
    def pv(self) -> str | None:
        """PV precision passed to `sageattn`, or None for full precision."""
        return {"full": None, "int8-fp16": "fp16", "int8-fp8": "fp8"}[self.value]


class Granularity(str, Enum):
    block = "block"
    token = "token"


class PlanError(ValueError):
    """A plan that cannot be used: bad JSON, bad field, unknown layer, step out of range."""


class Sparse(BaseModel):
    """Block-sparse attention of a quantized choice: the tile selection `method` and its target
    `density` (kept / all key tiles of a call, in (0, 1]; the forced tiles may keep more).

    `top_p` (dynamic only, in (0, 1]; None: not set) is the rule a dynamic call then runs: each query
    tile keeps the fewest tiles whose estimated mass reaches it, so query tiles with diffuse attention
    keep more than sharp ones, with no host read. `calibrate --sparse dynamic:D` finds it per layer
    on the captured calls (`pipelines.calibrate`); `density` then stays the target it was found for
    (reports). Without it a dynamic call keeps `density` of each query tile's key tiles (per row).

    `reuse_steps` (dynamic only, >= 1; None or 1: select at every call): a layer's call selects its
    tiles at one step and its calls of the next `reuse_steps - 1` steps of the same choice attend on
    those lists (`routing.LayerRoute.kept`), skipping the selection's work (docs/sparse.md).

    `head_density` (dynamic only; one value in [0, 1] per head of the layer, None: not measured) is
    the density each head reached where calibrate measured the setting. Only sequence parallelism
    reads it: Ulysses ranks then take heads in an order that gives each about the same density sum
    (`parallel.balance`), as one top_p per layer keeps more tiles in some heads than in others."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    method: SparseMethod
    density: float
    top_p: float | None = None
    reuse_steps: int | None = None
    head_density: tuple[float, ...] | None = None

    @field_validator("density")
    @classmethod
    def _check_density(cls, density: float) -> float:
        if not 0 < density <= 1:  # also NaN
            raise ValueError(f"density {density} must lie in (0, 1] (kept / all key tiles), e.g. 0.15")
        return density

    @field_validator("top_p")
    @classmethod
    def _check_top_p(cls, top_p: float | None) -> float | None:
        if top_p is not None and not 0 < top_p <= 1:  # also NaN
            raise ValueError(f"top_p {top_p} must lie in (0, 1] (the estimated attention mass each query tile "
                             "keeps), e.g. 0.9; leave it out for the per-row density")
        return top_p

    @field_validator("reuse_steps")
    @classmethod
    def _check_reuse_steps(cls, reuse_steps: int | None) -> int | None:
        if reuse_steps is not None and reuse_steps < 1:
            raise ValueError(f"reuse_steps {reuse_steps} must be at least 1 (the steps one selection serves, "
                             "e.g. 2: select every other step); leave it out to select at every step")
        return None if reuse_steps == 1 else reuse_steps  # 1 is the default: not written

    @field_validator("head_density")
    @classmethod
    def _check_head_density(cls, head_density: tuple[float, ...] | None) -> tuple[float, ...] | None:
        if head_density is not None and (not head_density or not all(0 <= d <= 1 for d in head_density)):
            raise ValueError(f"head_density {list(head_density)} must list one density in [0, 1] per head of the "
                             "layer (calibrate writes it); leave it out when unknown")
        return head_density

    @model_validator(mode="after")
    def _check_method(self):
        for name in ("top_p", "reuse_steps", "head_density"):
            if getattr(self, name) is not None and self.method != "dynamic":
                raise ValueError(f"{name}: only dynamic selection takes a {name} (static windows depend on no "
                                 f"input); remove {name} or give method 'dynamic' (got {self.method!r})")
        return self

    @property
    def text(self) -> str:
        """The text form `--sparse` takes: 'dynamic:0.15', 'dynamic:0.15:reuse2' (a top_p has none: it
        comes from calibrate)."""
        return sparse_text(self.method, self.density, self.reuse_steps)

    @property
    def label(self) -> str:
        """The text form, with the top_p when set: 'dynamic:0.15:reuse2 top_p 0.93'."""
        return self.text if self.top_p is None else f"{self.text} top_p {self.top_p:g}"

    @classmethod
    def parse(cls, text: str) -> Sparse | None:
        """`--sparse` text -> a Sparse, None for "off"; ValueError naming the fix."""
        parsed = parse_sparse(text)
        return None if parsed is None else cls(method=parsed[0], density=parsed[1], reuse_steps=parsed[2])


def _no_sparse_in_full(mode: Mode, sparse: Sparse | None) -> None:
    if sparse is not None and mode is Mode.full:
        raise ValueError("sparse: a 'full' choice runs full-precision SDPA, which is never block-sparse; "
                         "remove sparse or give a quantized mode (int8-fp16, int8-fp8)")


class Choice(BaseModel):
    """One attention setting; `sparse`: block-sparse attention (quantized modes only), None dense."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    mode: Mode
    granularity: Granularity = Granularity.block
    sparse: Sparse | None = None

    @model_validator(mode="after")
    def _check(self):
        _no_sparse_in_full(self.mode, self.sparse)
        return self

    @property
    def label(self) -> str:
        base = self.mode.value if self.mode is Mode.full else f"{self.mode.value}/{self.granularity.value}"
        return base if self.sparse is None else f"{base}+sparse {self.sparse.label}"


class Override(BaseModel):
    """`mode`/`granularity`/`sparse` for `layers` (all when omitted) during `steps` [start, stop)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    layers: tuple[str, ...] | None = None
    steps: tuple[int, int | None] | None = None
    mode: Mode
    granularity: Granularity = Granularity.block
    sparse: Sparse | None = None

    @model_validator(mode="after")
    def _check(self):
        _no_sparse_in_full(self.mode, self.sparse)
        return self

    @field_validator("steps")
    @classmethod
    def _check_steps(cls, steps):
        if steps is None:
            return steps
        start, stop = steps
        if start < 0 or (stop is not None and stop <= start):
            raise ValueError(f"steps {list(steps)}: need 0 <= start < stop (stop may be null for 'to the end')")
        return steps

    def matches(self, layer: str, step: int | None) -> bool:
        if self.layers is not None and layer not in self.layers:
            return False
        if self.steps is None or step is None:
            return self.steps is None
        start, stop = self.steps
        return start <= step and (stop is None or step < stop)

    @property
    def choice(self) -> Choice:
        return Choice(mode=self.mode, granularity=self.granularity, sparse=self.sparse)


class AttentionPlan(BaseModel):
    """Per-layer, per-step attention settings. Immutable; see the module docstring for JSON."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    version: int = 1  # left out: 2 when a choice is sparse (`_default_version`)
    model: str | None = None
    layers: tuple[str, ...] | None = None
    num_steps: int | None = Field(default=None, ge=1)
    default: Choice = Choice(mode=Mode.int8_fp16)
    overrides: tuple[Override, ...] = ()
    recipe: dict[str, Any] | None = None  # the speed recipe calibration measured under (informative)

    @model_validator(mode="before")
    @classmethod
    def _default_version(cls, data: Any) -> Any:
        """A plan that leaves its version out is version 2 when it has a sparse choice, else 1 (so a
        dense plan stays readable by a sagevideo that knows version 1 only)."""
        if isinstance(data, dict) and "version" not in data:
            entries = [data.get("default"), *(data.get("overrides") or ())]
            sparse = any((e.get("sparse") if isinstance(e, dict) else getattr(e, "sparse", None)) is not None
                         for e in entries if e is not None)
            data = {**data, "version": SPARSE_VERSION if sparse else 1}
        return data

    @model_validator(mode="after")
    def _check(self):
        if self.version not in READ_VERSIONS:
            raise ValueError(f"plan version {self.version} is not supported (this sagevideo reads versions "
                             f"{', '.join(map(str, READ_VERSIONS))})")
        if self.version < SPARSE_VERSION and self.uses_sparse:
            raise ValueError(f"version: a plan with sparse choices is version {SPARSE_VERSION}; set \"version\": "
                             f"{SPARSE_VERSION} (or leave it out)")
        known = set(self.layers) if self.layers is not None else None
        for i, o in enumerate(self.overrides):
            if known is not None and o.layers is not None:
                unknown = [name for name in o.layers if name not in known]
                if unknown:
                    raise ValueError(f"overrides[{i}]: unknown layer(s) {unknown}; the plan lists {len(known)} layers")
            if self.num_steps is not None and o.steps is not None and o.steps[0] >= self.num_steps:
                raise ValueError(f"overrides[{i}]: steps {list(o.steps)} start at or after num_steps={self.num_steps}")
        return self

    @classmethod
    def uniform(cls, mode: Mode | str, granularity: Granularity | str = "block") -> AttentionPlan:
        """The same attention everywhere."""
        return cls(default=Choice(mode=Mode(mode), granularity=Granularity(granularity)))

    @property
    def uses_sparse(self) -> bool:
        """Whether some choice of the plan is block-sparse."""
        return self.default.sparse is not None or any(o.sparse is not None for o in self.overrides)

    @classmethod
    def sparse_default(cls, choice: Choice, sparse: Sparse, *, steps: int, dense_layers: tuple[str, ...] = ()
                       ) -> AttentionPlan:
        """The plan `--sparse` builds for a job without a plan file: `choice` made `sparse` everywhere
        but the first `dense_steps(steps)` steps and `dense_layers` (each denoiser's first attention
        layer), which run `choice` dense."""
        dense = Choice(mode=choice.mode, granularity=choice.granularity)
        overrides = [Override(steps=(0, dense_steps(steps)), mode=dense.mode, granularity=dense.granularity)]
        if dense_layers:
            overrides.append(Override(layers=tuple(dense_layers), mode=dense.mode, granularity=dense.granularity))
        return cls(num_steps=steps, default=dense.model_copy(update={"sparse": sparse}), overrides=tuple(overrides))

    def with_sparse(self, sparse: Sparse, *, steps: int, dense_layers: tuple[str, ...] = ()) -> AttentionPlan:
        """This plan with `sparse` on each listed layer's quantized choice from step `dense_steps(steps)`
        on, but in `dense_layers` (`calibrate --sparse`: the precisions it measured, then the sparsity as
        given). PlanError for a plan that does not list its layers, has step ranges or sparse choices
        already (calibrate writes none such), or a run too short to leave a sparse step."""
        return self.with_sparse_layers({layer: sparse for layer in self.layers or () if layer not in dense_layers},
                                       steps=steps)

    def with_sparse_layers(self, settings: dict[str, Sparse], *, steps: int) -> AttentionPlan:
        """This plan with each layer of `settings` block-sparse as given on its quantized choice from
        step `dense_steps(steps)` on (`calibrate --sparse`: per layer the setting it measured; layers
        left out, and full-precision ones, stay dense). PlanError as `with_sparse`."""
        first = dense_steps(steps)
        if self.layers is None or self.uses_sparse or any(o.steps is not None for o in self.overrides):
            raise PlanError("with_sparse: needs a plan that lists its layers, without step ranges or sparse choices")
        if first >= steps:
            raise PlanError(f"with_sparse: a run of {steps} step(s) keeps its first {first} dense: none is sparse")
        groups: dict[tuple[Choice, Sparse], list[str]] = {}
        for layer in self.layers:
            choice = self.choice_for(layer, None)
            if layer in settings and choice.mode is not Mode.full:
                groups.setdefault((choice, settings[layer]), []).append(layer)
        added = [Override(layers=tuple(names), steps=(first, None), mode=c.mode, granularity=c.granularity,
                          sparse=sparse) for (c, sparse), names in groups.items()]
        data = self.model_dump(exclude={"version"})
        data["overrides"] = [*self.overrides, *added]
        return AttentionPlan.model_validate(data)

    def choice_for(self, layer: str, step: int | None) -> Choice:
        """The setting for `layer` at denoising step `step` (None: outside a tracked run)."""
        chosen = self.default
        for override in self.overrides:
            if override.matches(layer, step):
                chosen = override.choice
        return chosen

    def validate_for(self, layers: list[str], num_steps: int | None = None) -> None:
        """Raise PlanError if the plan names layers that `layers` lacks or steps beyond `num_steps`."""
        problems = self.problems_for(layers, num_steps)
        if problems:
            raise PlanError("; ".join(problems))

    def problems_for(self, layers: list[str], num_steps: int | None = None) -> list[str]:
        """Why the plan does not fit a transformer with these attention layers and a run of
        `num_steps` denoising steps (an override starting at or after the last step would never
        apply); [] when it fits."""
        problems = []
        present = set(layers)
        named = set(self.layers or ()) | {name for o in self.overrides for name in (o.layers or ())}
        unknown = sorted(named - present)
        if unknown:
            problems.append(
                f"plan names {len(unknown)} layer(s) this transformer does not have, e.g. {unknown[:3]}; "
                f"it has {len(present)} attention layers such as {sorted(present)[:2]}. Was the plan made for "
                f"another model ({self.model or 'unknown'})? Re-run `sagevideo calibrate` for this model."
            )
        if num_steps is not None:
            for i, o in enumerate(self.overrides):
                if o.steps is not None and o.steps[0] >= num_steps:
                    problems.append(
                        f"plan overrides[{i}] starts at step {o.steps[0]} but the run has {num_steps} steps "
                        f"(0..{num_steps - 1}), so it would never apply; fix its steps or the job's steps"
                    )
        return problems

    def head_problems(self, layer_heads: dict[str, int]) -> list[str]:
        """Why a sparse choice's `head_density` does not fit the layers it applies to (layer -> its
        attention heads; layers left out are not checked); [] when every one fits."""
        entries = [(None, self.default)] + [(o.layers, o) for o in self.overrides]
        problems = []
        for layers, entry in entries:
            densities = entry.sparse.head_density if entry.sparse is not None else None
            if densities is None:
                continue
            wrong = sorted(name for name, heads in layer_heads.items()
                           if (layers is None or name in layers) and heads != len(densities))
            if wrong:
                problems.append(f"plan lists {len(densities)} head densities for layer(s) with another head count, "
                                f"e.g. {wrong[0]} ({layer_heads[wrong[0]]} heads). Was the plan made for another "
                                f"model ({self.model or 'unknown'})? Re-run `sagevideo calibrate` for this model.")
        return problems

    def to_json(self) -> str:
        """JSON of the plan (fields left at None omitted: a dense plan's has no `sparse` key)."""
        return self.model_dump_json(indent=2, exclude_none=True)

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.write_text(self.to_json() + "\n")
        return path

    @classmethod
    def from_json(cls, text: str, source: str = "plan") -> AttentionPlan:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise PlanError(f"{source}: not valid JSON (line {err.lineno}, column {err.colno}: {err.msg})") from None
        try:
            return cls.model_validate(data)
        except ValidationError as err:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or 'plan'}: {e['msg'].removeprefix('Value error, ')}"
                for e in err.errors()
            )
            raise PlanError(f"{source}: {problems}") from None

    @classmethod
    def load(cls, path: str | Path) -> AttentionPlan:
        path = Path(path)
        if not path.is_file():
            raise PlanError(f"plan file {path} does not exist (write one with `sagevideo calibrate ... --out {path}`)")
        return cls.from_json(path.read_text(), source=str(path))


def dense_steps(steps: int) -> int:
    """How many first steps `--sparse` keeps dense by default: a fifth of them, rounded up (the
    early, high-noise steps lay out the video; sparsity there costs the most)."""
    return math.ceil(steps / 5)
