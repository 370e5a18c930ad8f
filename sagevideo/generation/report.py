"""What a batch run did: `BatchReport`, its counts and its one summary line.

The driver (`sagevideo.generation.run`) adds each finished job's manifest record to the report
(`BatchReport.add`); the report sums what ran (attention backends, SDPA fallbacks, block-sparse
calls and their density, the recipe's warm-up, compile-cache hits, step-cache skips, reuse of
finished videos) and says it all in
`summary_line()`, the line `sagevideo generate` prints last.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sagevideo.generation.plan import BatchPlan
from sagevideo.generation.resume import Stale
from sagevideo.outputs.manifest import MANIFEST_NAME, ManifestRecord

__all__ = ["BatchReport", "stale_text"]


@dataclass
class BatchReport:
    """What a run did. records: one per planned job (the new record, or the done one it skipped;
    None for jobs an interrupt left unrun). retried: jobs that needed more than one attempt because
    a worker died. workers: where it ran, e.g. "2 Ray worker(s) on 1 node(s) of a local Ray
    instance" (None: this process). signal: "SIGINT", "SIGTERM" or "SIGHUP" when one interrupted the run.
    stopped: why the run stopped early on its own (the disk is full). kept: (output name, new
    name) of earlier renders of changed jobs that were renamed, not overwritten. stale: earlier
    renders of jobs rendered again because the model changed. reused: (job id, `reused`) of each
    job done without rendering (made from a finished render of the same video)."""

    plan: BatchPlan
    records: list[ManifestRecord | None]
    done: int = 0
    skipped: int = 0
    failed: int = 0
    retried: int = 0
    interrupted: bool = False
    signal: str | None = None
    stopped: str | None = None
    kept: list[tuple[str, str]] = field(default_factory=list)
    stale: list[Stale] = field(default_factory=list)
    reused: list[tuple[str, dict[str, Any]]] = field(default_factory=list)  # (job id, its record's `reused`)
    workers: str | None = None
    attention: Counter = field(default_factory=Counter)  # backend label -> calls, e.g. "reference/fp16"
    fallbacks: Counter = field(default_factory=Counter)  # fallback reason -> calls
    # The recipe as the records saw it: first steps of the jobs it was applied for (compilation
    # lands there), and the step cache's forwards decided and skipped, summed over jobs.
    warmups: list[float] = field(default_factory=list)
    worker_starts: list[float] = field(default_factory=list)  # records' process_to_first_step_s
    cache_forwards: int = 0
    cache_skipped: int = 0
    graph_cache: Counter = field(default_factory=Counter)  # compiled graphs: "hit" (from the cache) / "miss" (not)
    sparse: SparseTally | None = None  # the block-sparse calls, under plans with sparse choices

    @property
    def ok(self) -> bool:
        return self.failed == 0 and not self.interrupted and not self.stopped

    def add(self, index: int, record: ManifestRecord, echo: Callable[[str], None]) -> None:
        """Count one finished job (its record is final and in the manifest)."""
        self.records[index] = record
        if record.done:
            self.done += 1
        else:
            self.failed += 1
            echo(f"sagevideo: job {record.job_id} ({self.plan.jobs[index].label}) failed: {record.error}")
        if record.attempts > 1:
            self.retried += 1
        if record.reused is not None:  # no attention ran for it here
            self.reused.append((record.job_id, dict(record.reused)))
            return
        backends = record.backends or {}
        self.attention.update(backends.get("counts", {}))
        self.fallbacks.update(backends.get("fallbacks", {}))
        if backends.get("sparse"):
            self.sparse = self.sparse or SparseTally()
            self.sparse.add(backends["sparse"])
        timings, recipe = record.timings or {}, record.recipe or {}
        if timings.get("recipe_s") is not None and timings.get("first_step_s") is not None:
            self.warmups.append(timings["first_step_s"])
        if timings.get("process_to_first_step_s") is not None:
            self.worker_starts.append(timings["process_to_first_step_s"])
        self.cache_forwards += recipe.get("cache_forwards") or 0
        self.cache_skipped += recipe.get("cache_skipped") or 0
        lookups = recipe.get("compile_cache_lookups") or {}
        # A graph the cache refused (bypass) was compiled afresh too: it counts as not from the cache.
        self.graph_cache.update(hit=lookups.get("fxgraph_cache_hit", 0),
                                miss=lookups.get("fxgraph_cache_miss", 0) + lookups.get("fxgraph_cache_bypass", 0))

    def summary_line(self) -> str:
        """One line, e.g. 'sagevideo: 2 done, 0 skipped, 0 failed → out (manifest.jsonl);
        attention: reference/fp16 x8'."""
        full = sum(1 for pj in self.plan.jobs if pj.backend is None)
        if full == len(self.plan.jobs):
            # Sequence parallelism needs its own processors, which then run SDPA.
            sharded = self.plan.gpus_per_job > 1
            attention = "full precision (SDPA inside Ulysses)" if sharded else "full precision (nothing installed)"
        elif self.attention:
            attention = ", ".join(f"{label} x{n}" for label, n in self.attention.most_common())
        else:
            attention = f"{self.plan.backend}/{self.plan.settings.pv} (no new calls)"
        if full and full < len(self.plan.jobs):
            attention += f"; full precision for {full} job(s)"
        state = ""
        if self.interrupted:
            state = "interrupted after " if self.signal == "SIGINT" else f"terminated ({self.signal}) after "
        elif self.stopped:
            state = "stopped after "
        line = (
            f"sagevideo: {state}{self.done} done, {self.skipped} skipped, {self.failed} failed → "
            f"{self.plan.out} ({MANIFEST_NAME}); attention: {attention}"
        )
        if self.sparse is not None:
            line += self.sparse.text()
        line += self._recipe_part()
        line += self._reuse_part()
        if self.workers:
            line += f"; ran on {self.workers}"
        if self.retried:
            line += f"; {self.retried} job(s) retried after a worker died"
        if self.fallbacks:
            reasons = "; ".join(f"{reason} (x{n})" for reason, n in self.fallbacks.most_common())
            line += f"; SDPA fallbacks: {reasons}"
        if self.kept:
            shown = ", ".join(f"{name} → {kept}" for name, kept in self.kept[:3])
            more = f" and {len(self.kept) - 3} more" if len(self.kept) > 3 else ""
            line += f"; earlier renders of changed jobs kept, not overwritten: {shown}{more}"
        if self.stopped:
            line += f"; stopped: {self.stopped}"
        if self.interrupted or self.stopped:
            line += "; re-run the same command to resume"
        return line

    def _reuse_part(self) -> str:
        """'; 2 of them not rendered again: 1 made from another job's identical video (1 hard link), 1
        with PNG frames decoded from the finished mp4', then '; 3 earlier render(s) stale, ...'; or ''."""
        line = ""
        if self.reused:
            other = [reused for job, reused in self.reused if reused.get("job_id") != job]
            how = Counter("hard link" if r.get("video") == "hardlink" else str(r.get("video")) for r in other)
            parts = []
            if other:
                links = ", ".join(f"{n} {kind}" for kind, n in how.most_common())
                parts.append(f"{len(other)} made from another job's identical video ({links})")
            decoded = sum(1 for _, reused in self.reused if reused.get("frames") == "decoded")
            if decoded:
                parts.append(f"{decoded} with PNG frames decoded from the finished mp4")
            line += f"; {len(self.reused)} of them not rendered again: " + ", ".join(parts)
        if self.stale:
            line += "; " + stale_text(self.stale, self.plan.source.fingerprint)
        return line

    def _recipe_part(self) -> str:
        """'; recipe regional+fp8 (first step where applied: 24.5 s, compilation included; worker
        start to its first step: 40.1 s; 0 of 2 compiled graphs from the compile cache)', with the
        cache's skipped forwards; '' for a plain recipe."""
        recipe = self.plan.settings.recipe
        if recipe.is_plain:
            return ""
        notes = []
        if recipe.compile != "none" and self.warmups:
            notes.append(f"first step where applied: {max(self.warmups):.1f} s, compilation included")
        if recipe.compile != "none" and self.worker_starts:
            notes.append(f"worker start to its first step: {max(self.worker_starts):.1f} s")
        if sum(self.graph_cache.values()):
            notes.append(f"{self.graph_cache['hit']} of {sum(self.graph_cache.values())} compiled graphs "
                         "from the compile cache")
        if self.cache_forwards:
            notes.append(f"cache skipped {self.cache_skipped} of {self.cache_forwards} forwards")
        return f"; recipe {recipe.label()}" + (f" ({'; '.join(notes)})" if notes else "")


@dataclass
class SparseTally:
    """Block-sparse calls summed over jobs' records (`backends["sparse"]`, `BackendLog.sparse_summary`):
    every call of the layers under a sparse plan, those the plan made sparse, and of those the ones
    that ran dense all the same (with why). A call that ran dense has density 1 by definition."""

    calls: int = 0
    planned: int = 0
    planned_density: float = 0.0  # the planned calls' densities, summed
    ran_dense: Counter = field(default_factory=Counter)  # reason -> planned calls that ran dense
    rank_spread: tuple[float, str] | None = None  # sequence-parallel jobs: the largest, and its layer

    # Ranks this much busier than their mean in some layer are worth balancing (docs/sparse.md).
    UNEVEN_RANKS = 1.1

    def add(self, summary: dict[str, Any]) -> None:
        for name, layer in summary.get("layers", {}).items():
            self.calls += layer.get("calls", 0)
            planned = layer.get("sparse_calls", 0)
            self.planned += planned
            self.planned_density += planned * layer.get("sparse_density", 1.0)
            self.ran_dense.update(layer.get("dense", {}))
            spread = layer.get("rank_spread")
            if spread is not None and (self.rank_spread is None or spread > self.rank_spread[0]):
                self.rank_spread = (spread, name)

    def text(self) -> str:
        """'; block-sparse: 312 of 960 calls at density 0.16, 328 dense by the plan', then the planned
        calls that ran dense and the commonest reason, or that every tile was kept; and where
        sequence-parallel ranks were unevenly loaded (`rank_spread` above UNEVEN_RANKS), by how much."""
        dense = sum(self.ran_dense.values())
        sparse = self.planned - dense
        if sparse <= 0:
            why = f": {self.ran_dense.most_common(1)[0][0]}" if dense else ""
            return f"; block-sparse: none of {self.calls} calls ran sparse{why}"
        density = (self.planned_density - dense) / sparse
        text = f"; block-sparse: {sparse} of {self.calls} calls at density {density:.2f}"
        text += " (every tile kept at this size or on these inputs)" if density >= 0.9995 else ""
        if self.calls > self.planned:
            text += f", {self.calls - self.planned} dense by the plan"
        if dense:
            text += f", {dense} planned sparse that ran dense ({self.ran_dense.most_common(1)[0][0]})"
        if self.rank_spread is not None and self.rank_spread[0] > self.UNEVEN_RANKS:
            spread, layer = self.rank_spread
            text += f", sequence-parallel ranks unevenly loaded (up to {spread:.2f}x their mean, {layer})"
        return text


def stale_text(stale: list[Stale], fingerprint: str) -> str:
    """Why earlier renders render again, e.g. '2 earlier render(s) stale, rendered again: the model
    changed since (fingerprint 1a2b3c4d5e6f, now 0f9e8d7c6b5a: its weights or configs differ)'."""
    parts = []
    changed = [s.record for s in stale if s.why == "model"]
    if changed:
        old = ", ".join(sorted({str(r.model_fingerprint) for r in changed}))
        parts.append(f"{len(changed)} earlier render(s) stale, rendered again: the model changed since (fingerprint "
                     f"{old}, now {fingerprint}: its weights or configs differ)")
    unverified = sum(1 for s in stale if s.why == "unverified")
    if unverified:
        parts.append(f"{unverified} earlier render(s) rendered again: recorded by a sagevideo whose model fingerprint "
                     "did not cover weight contents, so a changed model could not be ruled out")
    return "; ".join(parts)
