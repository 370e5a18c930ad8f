"""One job over several processes (Ulysses sequence parallelism): a rank's host.

`ShardedHost` is the `PipelineHost` of one rank, composed with its model family's Ulysses hooks
(`ModelFamily.shard`) as the attention hook. Every rank loads the pipeline once and runs every
job with the same inputs (the seed makes the same noise everywhere); the hooks split the
transformer's tokens across the ranks. Rank 0 runs the job exactly as a plain worker does (VAE
decode, staged mp4, manifest record); the other ranks run the same generation loop with the same
arguments (so the same collective calls in the same order) and stop after denoising: the VAE
decode runs on rank 0 only. Every rank hands back a `RankResult` (`run_rank`); rank 0's carries
the record. Needs the default process group
(`sagevideo.parallel.launch.init_from_env`), whether Ray actors or
`python -m sagevideo.generation.torchrun` started the ranks.

Whether a degree can split a batch is checked before anything loads, from configs, by
`sagevideo.pipelines.families.degree_problems` (re-exported here).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sagevideo.host.pipeline_host import PipelineHost, PlannedJob, RunContext, is_device_error
from sagevideo.host.result import RankResult
from sagevideo.outputs.manifest import ManifestRecord
from sagevideo.pipelines.families import degree_problems

__all__ = ["ShardedAttention", "ShardedHost", "degree_problems"]


class ShardedAttention:
    """The attention hook of a rank: the family's Ulysses hooks with sagevideo attention for
    (backend, pv, plan); attention "full" (backend None) runs SDPA inside Ulysses, as sharding
    needs the sagevideo processors."""

    def __init__(self, family: Any, group: Any = None):
        self.family, self.group = family, group

    def __call__(self, pipe: Any, backend: str | None, pv: str | None, plan: str | None) -> Any:
        from sagevideo.pipelines.plans import AttentionPlan

        if backend is None:
            return self.family.shard(pipe, group=self.group, plan=AttentionPlan.uniform("full"), backend="sdpa")
        return self.family.shard(pipe, group=self.group, plan=plan, pv=pv, backend=backend)


class ShardedHost(PipelineHost):
    """One rank of a sequence-parallel group: see the module docstring.

    rank/world: this process's rank and the group size (from `init_from_env`).
    `run_rank` returns every rank's `RankResult` (rank 0's with the job's record); `run`, rank 0's
    record, is for rank 0 only. Failpoints ("mid-denoise" with @RANK)
    can stop one rank in the middle of a job while the others wait for it in a collective.
    """

    def __init__(self, ctx: RunContext, *, rank: int, world: int, worker: dict[str, Any] | None = None):
        self.world = world
        super().__init__(ctx, worker=worker, attention=ShardedAttention(ctx.source.model_family), rank=rank)

    def run(self, pj: PlannedJob, **options: Any) -> ManifestRecord:
        """Rank 0's record of the job (see `PipelineHost.run`); the other ranks write nothing: `run_rank`."""
        if self.rank != 0:
            raise RuntimeError(f"rank {self.rank} writes no video and no record; call run_rank")
        return super().run(pj, **options)

    def run_rank(
        self,
        pj: PlannedJob,
        *,
        attempt: int = 1,
        on_step: Callable[[int, int], None] | None = None,
        time_limit: float | None = None,
    ) -> RankResult:
        """This rank's share of the job. on_step, time_limit: rank 0 only (the ranks step together)."""
        if self.rank == 0:
            return super().run_rank(pj, attempt=attempt, on_step=on_step, time_limit=time_limit)
        try:
            self.generate(pj, attempt=attempt, decode=False)
        except Exception as err:  # reported to the driver, which decides for the whole group
            return RankResult(self.rank, "failed", f"{type(err).__name__}: {err}", device_error=is_device_error(err))
        return RankResult(self.rank, "done")
