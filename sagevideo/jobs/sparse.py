"""`--sparse`: block-sparse attention as a run's setting (pydantic, no torch; docs/sparse.md).

One option, declared once in `SparseOptions`, which the configs of generate, ab and calibrate
inherit as they inherit the recipe's options; a job file gives it per job (`sparse:` in `defaults:`
or a job, a `JobSpec` field). Its text form is `sagevideo.choices.parse_sparse`'s:
METHOD:DENSITY[:reuseN] ("dynamic:0.15", "static:0.25", "dynamic:0.15:reuse2") or "off" (the
default: dense, nothing changes). Values are kept in their canonical text (`sparse_text`), so equal
settings compare equal.

With it and no plan file, a job runs the plan `sagevideo.pipelines.sparse.job_plan` builds: its
quantized attention block-sparse, but for the first ceil(steps/5) steps and each denoiser's first
attention layer. With a plan file the plan's own settings rule, and giving both is refused
(`sparse_problems`), as is `--attention full` (full precision is never sparse), before anything
loads. `--gpus-per-job` > 1 composes: after Ulysses' all-to-all each rank selects tiles over its own
heads of the whole sequence, as one process does. `--compile` composes: the
selection reads nothing on the host (a dynamic call selects a per-row density inside itself, a static
mask is a constant), so compiled blocks keep whole graphs; their calls are noted per layer in the
manifest's `backends.sparse` as eager ones are (each layer's statistics kept on the device, read at
the end of each forward).
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar

from pydantic import BaseModel, BeforeValidator, Field

from sagevideo.choices import SPARSE_OFF, parse_sparse, sparse_text


def _canonical(value: Any) -> Any:
    """A setting's canonical text ('dynamic:0.15', 'off'); False (YAML reads `off` as false) is off;
    ValueError naming the fix for anything else."""
    if value is None:
        return None
    if value is False:
        return SPARSE_OFF
    if not isinstance(value, str):
        raise ValueError(f"sparse {value!r}: give METHOD:DENSITY (e.g. dynamic:0.15, static:0.25; dynamic:0.15:reuse2 "
                         "selects every other step) or off")
    parsed = parse_sparse(value)
    return SPARSE_OFF if parsed is None else sparse_text(*parsed)


SparseText = Annotated[str, BeforeValidator(_canonical)]  # a job field's and the option's value type

SPARSE_HELP = (
    "Block-sparse attention in the quantized layers: METHOD:DENSITY, dynamic (pooled Q/K scores choose each query "
    "tile's key tiles) or static (3-D windows on the latent grid), DENSITY in (0, 1] the share of key tiles kept, "
    "e.g. dynamic:0.15; off: dense. Without a plan the first ceil(steps/5) steps and each denoiser's first "
    "attention layer stay dense, and text rows and columns always do; recorded per layer in the manifest (eager "
    "calls). dynamic keeps about DENSITY of each query tile's key tiles (its most probable ones); dynamic:DENSITY:"
    "reuseN selects every N-th step and attends on those tiles in between (calibrate measures it per layer). Not "
    "with --plan (put sparse in the plan) or --attention full (docs/sparse.md)."
)


class SparseOptions(BaseModel):
    """The block-sparse setting, declared once for generate, ab and calibrate (each inherits it)."""

    cli_panel: ClassVar[str] = "Block-sparse attention (docs/sparse.md)"

    sparse: SparseText = Field(SPARSE_OFF, description=SPARSE_HELP)


def _budget(value: Any) -> Any:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and not 0 < value <= 1:  # also NaN
        raise ValueError("not a cosine in (0, 1]; the default is 0.99")
    return value


class SparseBudgetOptions(BaseModel):
    """The error budget under which `calibrate --sparse` proposes per-layer densities (calibrate only)."""

    cli_panel: ClassVar[str] = SparseOptions.cli_panel

    sparse_budget: Annotated[float | None, BeforeValidator(_budget)] = Field(
        None, description="With --sparse: the worst cosine (over heads, calls and captured steps) a layer's sparse "
        "output must keep against the same mode's dense output; per layer the sparsest of DENSITY, 2x and 4x "
        "DENSITY that meets it is proposed, dense where none does (default 0.99).")


def is_sparse(value: str | None) -> bool:
    """Whether a (canonical) setting asks for block-sparse attention."""
    return value is not None and value != SPARSE_OFF


def job_sparse_problem(sparse: str | None, attention: str | None, plan: str | None) -> str | None:
    """Why a resolved job cannot run `sparse` ('sparse: ...' with the fix), or None."""
    if not is_sparse(sparse):
        return None
    if attention == "full":
        return (f"sparse: {sparse} with attention full: full precision runs stock SDPA, which is never block-sparse; "
                "use sparse off or attention sage")
    if plan:
        return (f"sparse: {sparse} with plan {plan}: a plan file's own settings rule; put the sparse setting in the "
                "plan (\"sparse\": {\"method\": ..., \"density\": ...} on its quantized choices) or leave sparse off")
    return None
