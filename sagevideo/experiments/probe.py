"""Attention probe: per-layer error of the quantized attention during a real run.

`ProbeRouter` is an `AttentionRouter` (installed with `install_router`, like calibration's
probing router): every attention call runs what the plan says (so the run *is* the quantized
run) and, on the same Q/K/V, also fp32 SDPA (the reference) and SDPA in the model's dtype
(what the full-precision arm computes). It keeps, per layer and denoising step, cosine /
relative L1 / RMSE (`sagevideo.attention.accuracy`, per batch×head slice, mean and worst) of
quantized vs reference, and of full precision vs reference: the floor that full precision
itself sits at.

`rerun_arm` re-runs the quantized arm's jobs from their manifest records (same prompt, seed,
size, steps, guidance) through the one generation path: a `PipelineHost` whose attention hook
installs the router (`RouterAttention`), writing each video staged into a temporary folder, as a
batch worker would. Each re-run video, encoded like the arm's, is compared with the arm's file:
`reproduced` says whether the probe saw exactly the run that made the quantized videos. A
`--sparse` arm's jobs re-run the plan `--sparse` built for each (`pipelines.sparse.job_plan`), so the
probe measures the block-sparse calls against fp32 dense attention: the error of quantization and
sparsity together.
"""

from __future__ import annotations

import math
import tempfile
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from sagevideo.attention.accuracy import error_stats, peaky_reason, score_std
from sagevideo.attention.functional import TORCH_SDPA
from sagevideo.pipelines.plans import AttentionPlan
from sagevideo.pipelines.routing import AttentionRouter

METRIC_NAMES = ("cos", "rel_l1", "rmse")
# A layer is flagged as too peaky for INT8 when its attention is past INT8's resolution
# (`attention.accuracy.PEAKY_SCORE_STD`) and its worst cosine below the 16-bit P·V contract.
PEAKY_COSINE = 0.999


class ProbeRunError(RuntimeError):
    """A job re-run by `rerun_arm` failed (its error is in the message)."""


@dataclass
class _Cell:
    """Errors of one (prompt, layer, step): one or more calls."""

    calls: int = 0
    cos_sum: float = 0.0
    cos_worst: float = 1.0
    rel_l1_sum: float = 0.0
    rel_l1_worst: float = 0.0
    rmse_sum: float = 0.0
    rmse_worst: float = 0.0
    slices: int = 0
    nonfinite: int = 0
    score_std: float = 0.0  # the largest seen (`attention.accuracy.score_std`)

    def add(self, ref: torch.Tensor, out: torch.Tensor) -> None:
        e = error_stats(ref, out)
        self.calls += 1
        self.slices += e.n_slices
        self.nonfinite += e.nonfinite
        self.cos_sum += e.cos_mean * e.n_slices
        self.rel_l1_sum += e.rel_l1_mean * e.n_slices
        self.rmse_sum += e.rmse_mean * e.n_slices
        self.cos_worst = min(self.cos_worst, e.cos_worst)
        self.rel_l1_worst = max(self.rel_l1_worst, e.rel_l1_worst)
        self.rmse_worst = max(self.rmse_worst, e.rmse_worst)


@dataclass
class ProbeRecorder:
    """Cells keyed by (prompt index, layer, step), for the test arm and the full-precision floor."""

    test: dict[tuple[int, str, int | None], _Cell] = field(default_factory=lambda: defaultdict(_Cell))
    floor: dict[tuple[int, str, int | None], _Cell] = field(default_factory=lambda: defaultdict(_Cell))
    modes: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    prompt_index: int = 0


class ProbeRouter(AttentionRouter):
    """Runs the plan's attention and measures it (and SDPA in the input dtype) against fp32 SDPA."""

    def __init__(self, plan: AttentionPlan, backend: str, recorder: ProbeRecorder | None = None):
        super().__init__(plan, backend)
        self.recorder = recorder or ProbeRecorder()

    def __call__(self, layer, q, k, v, *, attn_mask=None, is_causal=False, sm_scale=None, dropout_p=0.0,
                 enable_gqa=False):
        out = super().__call__(layer, q, k, v, attn_mask=attn_mask, is_causal=is_causal, sm_scale=sm_scale,
                               dropout_p=dropout_p, enable_gqa=enable_gqa)
        sdpa = dict(attn_mask=attn_mask, is_causal=is_causal, scale=sm_scale, enable_gqa=enable_gqa)
        ref = TORCH_SDPA(q.float(), k.float(), v.float(), **sdpa)
        full = TORCH_SDPA(q, k, v, **sdpa)
        key = (self.recorder.prompt_index, layer, self.clock.step)
        self.recorder.test[key].add(ref, out)
        self.recorder.floor[key].add(ref, full)
        cell = self.recorder.test[key]
        cell.score_std = max(cell.score_std, score_std(q, k, sm_scale=sm_scale))
        self.recorder.modes[layer].add(self.choice(layer).label)
        return out


def _aggregate(cells: dict[tuple[int, str, int | None], _Cell], prompts: list[str]) -> dict[str, Any]:
    """Overall and per-layer mean/worst, worst (layer, step, prompt), per-step worst cosine."""
    layers: dict[str, dict[str, Any]] = {}
    overall = {"calls": 0, "slices": 0, "nonfinite": 0, "cos_sum": 0.0, "rel_l1_sum": 0.0, "rmse_sum": 0.0}
    worst = {"cos": (math.inf, None), "rel_l1": (-math.inf, None), "rmse": (-math.inf, None)}
    per_prompt: dict[int, list[float]] = defaultdict(lambda: [0.0, 0])
    for (pi, layer, step), c in cells.items():
        entry = layers.setdefault(
            layer,
            {
                "layer": layer,
                "calls": 0,
                "slices": 0,
                "cos_sum": 0.0,
                "rel_l1_sum": 0.0,
                "rmse_sum": 0.0,
                "cos_worst": 1.0,
                "cos_worst_step": None,
                "cos_worst_prompt": None,
                "rel_l1_worst": 0.0,
                "rmse_worst": 0.0,
                "score_std": 0.0,
                "steps": {},
            },
        )
        entry["score_std"] = max(entry["score_std"], c.score_std)
        entry["calls"] += c.calls
        entry["slices"] += c.slices
        for name in METRIC_NAMES:
            entry[f"{name}_sum"] += getattr(c, f"{name}_sum")
            overall[f"{name}_sum"] += getattr(c, f"{name}_sum")
        if c.cos_worst < entry["cos_worst"] or entry["cos_worst_step"] is None:
            entry.update(cos_worst=c.cos_worst, cos_worst_step=step, cos_worst_prompt=prompts[pi])
        entry["rel_l1_worst"] = max(entry["rel_l1_worst"], c.rel_l1_worst)
        entry["rmse_worst"] = max(entry["rmse_worst"], c.rmse_worst)
        step_key = -1 if step is None else step
        entry["steps"][step_key] = min(entry["steps"].get(step_key, 1.0), c.cos_worst)
        overall["calls"] += c.calls
        overall["slices"] += c.slices
        overall["nonfinite"] += c.nonfinite
        where = {"layer": layer, "step": step, "prompt": prompts[pi]}
        if c.cos_worst < worst["cos"][0]:
            worst["cos"] = (c.cos_worst, where)
        if c.rel_l1_worst > worst["rel_l1"][0]:
            worst["rel_l1"] = (c.rel_l1_worst, where)
        if c.rmse_worst > worst["rmse"][0]:
            worst["rmse"] = (c.rmse_worst, where)
        per_prompt[pi][0] += c.cos_sum
        per_prompt[pi][1] += c.slices
    out_layers = []
    for entry in layers.values():
        slices = max(entry.pop("slices"), 1)
        for name in METRIC_NAMES:
            entry[f"{name}_mean"] = entry.pop(f"{name}_sum") / slices
        steps = entry.pop("steps")
        entry["cos_worst_by_step"] = [steps[s] for s in sorted(steps)]
        entry["steps"] = sorted(steps)
        out_layers.append(entry)
    slices = max(overall["slices"], 1)
    summary = {
        "calls": overall["calls"],
        "nonfinite": overall["nonfinite"],
        **{f"{name}_mean": overall[f"{name}_sum"] / slices for name in METRIC_NAMES},
        **{f"{name}_worst": (worst[name][0] if worst[name][1] else None) for name in METRIC_NAMES},
        "worst_at": {name: worst[name][1] for name in METRIC_NAMES},
    }
    prompt_cos = [per_prompt[i][0] / max(per_prompt[i][1], 1) for i in sorted(per_prompt)]
    return {"summary": summary, "layers": out_layers, "per_prompt_cos_mean": prompt_cos}


def summarize_probe(recorder: ProbeRecorder, prompts: list[str]) -> dict[str, Any]:
    """JSON-ready probe results: quantized vs fp32 SDPA, and the full-precision floor."""
    test = _aggregate(recorder.test, prompts)
    floor = _aggregate(recorder.floor, prompts)
    for layer in test["layers"]:
        layer["modes"] = sorted(recorder.modes.get(layer["layer"], ()))
        match = next((f for f in floor["layers"] if f["layer"] == layer["layer"]), None)
        layer["floor_cos_worst"] = match["cos_worst"] if match else None
        layer["floor_cos_mean"] = match["cos_mean"] if match else None
    peaky = [{"layer": layer["layer"], "score_std": layer["score_std"], "cos_worst": layer["cos_worst"],
              "why": peaky_reason(layer["score_std"])}
             for layer in test["layers"] if peaky_reason(layer["score_std"]) and layer["cos_worst"] < PEAKY_COSINE]
    return {
        "reference": "fp32 SDPA on the same Q/K/V",
        "peaky_layers": peaky,
        "peaky_advice": ("keep these layers in full precision: `sagevideo calibrate` writes such a plan, or list "
                         "them in a plan override with mode 'full'") if peaky else "",
        "floor_is": "SDPA in the model's dtype (what the full-precision arm computes) vs fp32 SDPA",
        "slices": "per (batch, head) of each call; mean over slices, worst over slices, calls and steps",
        "prompts": prompts,
        "summary": test["summary"],
        "floor": floor["summary"],
        "layers": test["layers"],
        "per_prompt_cos_mean": test["per_prompt_cos_mean"],
    }


def rerun_arm(
    records: list[dict[str, Any]],
    *,
    arm_dir: str | Path,
    plan: AttentionPlan | str | Path | None = None,
    model: str | None = None,
    probe: bool = True,
    progress: Any = None,
) -> dict[str, Any]:
    """Re-run an arm's jobs (from their manifest records) with `plan` installed by router, under the
    arm's recipe but its compile (`_rerun_recipe`), and compare each video with the arm's file in
    `arm_dir` ("reproduced").

    probe: install a `ProbeRouter` and measure every call (else the plain `AttentionRouter`).
    model/backend/device/dtype/pv/fps come from the records. Returns {"probe": summarize_probe(...)
    or None, "reproduced": {...}, "plan": ..., "backend": ...}. Raises ModelLoadError when the model
    cannot be loaded, ProbeRunError when a re-run job fails.
    """
    import numpy as np

    from sagevideo.eval.pairing import video_file
    from sagevideo.host.pipeline_host import PipelineHost, PlannedJob, RouterAttention, RunContext
    from sagevideo.jobs.specs import JobSpec
    from sagevideo.outputs.video import read_frames
    from sagevideo.pipelines import loading

    first = records[0]
    source = loading.resolve_model(model or first["model"])
    backend = first.get("backend") or "reference"
    pv = first.get("pv") or "fp16"
    if plan is not None and not isinstance(plan, AttentionPlan):
        plan = AttentionPlan.load(plan)
    recorder = ProbeRecorder()
    reproduced, prompts = [], []
    with tempfile.TemporaryDirectory(prefix="sagevideo-probe-") as tmp:
        ctx = RunContext(out=Path(tmp), source=source, device=first["device"], dtype=first["dtype"],
                         fps=first.get("fps") or 8, recipe=_rerun_recipe(first.get("recipe")))
        host = PipelineHost(ctx)
        plan_of = _plan_of_records(host.pipe, plan, pv)
        plan = plan_of(first)
        router = ProbeRouter(plan, backend, recorder) if probe else AttentionRouter(plan, backend)
        host.attention = RouterAttention(router, pv=pv, backend=backend)
        try:
            for index, record in enumerate(records):
                recorder.prompt_index = index
                router.plan = plan_of(record)  # a --sparse job's plan depends on its steps: the clock re-resolves
                prompts.append(record["prompt"])
                if progress is not None:
                    progress(f"re-run {index + 1}/{len(records)}: {record['prompt'][:40]}")
                job = JobSpec(**{k: record.get(k) for k in _JOB_FIELDS if record.get(k) is not None})
                pj = PlannedJob(job=job, job_id=record["job_id"], output=f"probe-{index}.mp4",
                                label=f"re-run {index + 1}", backend=backend, image_sha256=record.get("image_sha256"))
                done = host.run(pj)
                if done.status != "done":
                    what = record["prompt"][:40]
                    raise ProbeRunError(f"attention probe: re-running {what!r} failed: {done.error}")
                staged = Path(tmp) / done.handoff.staged
                probed = read_frames(staged)
                staged.unlink()
                arm = read_frames(Path(arm_dir) / video_file(record))
                same_shape = probed.shape == arm.shape
                max_diff = int(np.abs(probed.astype(np.int16) - arm.astype(np.int16)).max()) if same_shape else None
                reproduced.append(
                    {
                        "prompt": record["prompt"],
                        "seed": record["seed"],
                        "max_abs_diff": max_diff,
                        "identical": same_shape and max_diff == 0,
                    }
                )
        finally:
            host.close()
    out: dict[str, Any] = {"probe": None}
    out["reproduced"] = {
        "all_identical": all(r["identical"] for r in reproduced),
        "videos": reproduced,
        "how": "each re-run video encoded like the arm's and compared with the arm's file (uint8 max |diff|)",
    }
    if probe:
        out["probe"] = summarize_probe(recorder, prompts)
        out["probe"]["plan"] = plan.model_dump(mode="json")
        out["probe"]["backend"] = backend
        out["probe"]["reproduced"] = out["reproduced"]
    out["plan"] = plan.model_dump(mode="json")
    out["backend"] = backend
    return out


def _plan_of_records(pipe: Any, plan: AttentionPlan | None, pv: str) -> Any:
    """record -> the plan its job ran: `plan` when given, else the one `--sparse` built for it
    (`pipelines.sparse.job_plan`: its dense first steps depend on the job's steps), else `pv` everywhere."""
    from sagevideo.jobs.sparse import is_sparse
    from sagevideo.pipelines.sparse import job_plan

    def plan_of(record: dict[str, Any]) -> AttentionPlan:
        if plan is not None:
            return plan
        if is_sparse(record.get("sparse")):
            return job_plan(pipe, pv, record["sparse"], int(record["steps"]))
        return AttentionPlan.uniform(f"int8-{pv}")

    return plan_of


def _rerun_recipe(recorded: dict[str, Any] | None) -> Any:
    """The arm's recipe (its manifest `recipe`) for the re-run, without compile: FP8 linears change
    the Q/K/V attention sees and a step cache which forwards run, so both are what the arm ran;
    compiling changes neither (the probe measures in Python, which compiled code would trace)."""
    if not recorded:
        return None
    from sagevideo.jobs.recipe import RECIPE_FIELDS, Recipe

    settings = {name: recorded[name] for name in RECIPE_FIELDS if name in recorded}
    recipe = Recipe(**{**settings, "compile": "none", "compile_backend": "inductor"})
    return None if recipe.is_plain else recipe


# Manifest-record fields that say what a job made (the rest say how and where it ran).
_JOB_FIELDS = ("prompt", "negative_prompt", "seed", "frames", "height", "width", "steps", "guidance", "image")
