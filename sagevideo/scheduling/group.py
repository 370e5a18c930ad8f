"""Sequence-parallel groups on Ray: one job over N rank actors in one STRICT_PACK placement group.

A group is what a plain worker is for `queue`, made of N processes:
- `GroupLauncher.start()` reserves N bundles (1 GPU, or 1 CPU, each) in a new placement group
  with strategy STRICT_PACK (all on one node: Ulysses exchanges activations at every layer, so
  the ranks need NVLink/shared memory, not the network), and starts a `RankWorker` in each;
- each rank's `place()` says where it runs, rank 0's also picks a free port on its node;
- each rank's `setup(..., *places)` (Ray passes it every rank's place once known) sets the
  torchrun variables (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT),
  joins the process group through `sagevideo.parallel.launch.init_from_env`, loads the pipeline
  once and keeps a `ShardedHost`;
- `run(job, attempt)` goes to every rank; each returns its `RankResult`, rank 0's with the
  manifest record (and the staged file). Only rank 0 decodes and writes.
A group is never repaired: when one rank dies, `queue` stops them all (and removes the
placement group) and starts a fresh group, because the survivors' process group is broken.
torch.distributed stays in `sagevideo.parallel`; Ray stays here.
"""

from __future__ import annotations

import logging
import os
import socket
from typing import Any

from sagevideo.host import failpoints
from sagevideo.host.pipeline_host import ModelLoadError, PlannedJob, RunContext, worker_info
from sagevideo.host.result import RankResult

log = logging.getLogger("sagevideo")


def torchrun_env(rank: int, places: list[dict[str, Any]]) -> dict[str, str]:
    """The variables torchrun would set for `rank` of a one-node group whose ranks are at `places`
    (rank order; places[0] has the rendezvous "ip" and "port")."""
    world = len(places)
    env = {
        "RANK": str(rank),
        "WORLD_SIZE": str(world),
        "LOCAL_RANK": str(rank),
        "LOCAL_WORLD_SIZE": str(world),
        "MASTER_ADDR": places[0]["ip"],
        "MASTER_PORT": str(places[0]["port"]),
    }
    gpus = [place["gpus"][0] for place in places if place.get("gpus")]
    if len(gpus) == world:
        # Ray shows each actor its own GPU only. Like torchrun (and Ray Train), let every rank see
        # the group's GPUs, in rank order, so LOCAL_RANK picks its own and NCCL can use the
        # peer-to-peer links between them. Must be set before CUDA starts in the process.
        env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
    return env


def free_port(ip: str) -> int:
    """A TCP port free on this node now, for the process group's rendezvous (rank 0 listens there)."""
    with socket.socket() as s:
        s.bind((ip, 0))
        return s.getsockname()[1]


class RankWorker:
    """Actor body of one rank. `__init__` does nothing heavy: on CUDA, the GPUs a rank sees are
    rearranged in `setup` before anything starts CUDA."""

    def __init__(self, rank: int, world: int):
        import ray

        self.rank, self.world = rank, world
        node = ray.get_runtime_context().get_node_id()
        self.info = {**worker_info(node), "rank": rank, "ranks": world}
        self.host: Any = None
        self.error: str | None = None
        self.steps_queue: Any = None

    def place(self) -> dict[str, Any]:
        """{"rank", "ip", "gpus"} (Ray's GPU ids for this actor), and on rank 0 a free "port"."""
        import ray

        ip = ray.util.get_node_ip_address()
        found = {"rank": self.rank, "ip": ip, "gpus": [str(g) for g in ray.get_gpu_ids()]}
        if self.rank == 0:
            found["port"] = free_port(ip)
        return found

    def setup(
        self,
        ctx: RunContext,
        marker: str | None,
        armed: str | None,
        steps_queue: Any,
        dist_backend: str,
        *places: dict,
    ) -> dict[str, Any]:
        """Join the group and load the pipeline; returns this rank's info with "error": None, or
        why it cannot run jobs (the driver then stops the whole group). armed: the driver's
        failpoints (tests only). steps_queue: the driver's step-progress queue; rank 0 reports to it."""
        from sagevideo.host.sharded import ShardedHost
        from sagevideo.parallel.launch import init_from_env

        failpoints.arm(armed)
        self.steps_queue = steps_queue if self.rank == 0 else None
        try:
            if marker is not None and not (ctx.out / marker).is_file():
                raise FileNotFoundError(
                    f"{self.info['host']} does not see the driver's output folder {ctx.out}; with several "
                    "machines, --out must be on storage every node mounts at the same path"
                )
            os.environ.update(torchrun_env(self.rank, list(places)))
            init_from_env(dist_backend)
            self.host = ShardedHost(ctx, rank=self.rank, world=self.world, worker=self.info)
        except Exception as err:  # reported through the return value; the driver stops the group
            self.error = str(err) if isinstance(err, ModelLoadError) else f"{type(err).__name__}: {err}"
        return {**self.info, "error": self.error}

    def run(self, pj: PlannedJob, attempt: int) -> RankResult:
        """This rank's result of the job (rank 0's with the job's record)."""
        from sagevideo.scheduling.worker import step_reporter

        if self.host is None:
            raise RuntimeError(f"rank {self.rank} cannot run jobs: {self.error}")
        return self.host.run_rank(pj, attempt=attempt, on_step=step_reporter(self.steps_queue, pj))


class GroupLauncher:
    """Starts, feeds and stops groups of `ranks` RankWorkers (the `queue` launcher interface:
    start() -> (actors, placement group, ready refs); run(...) -> refs; stop(...))."""

    def __init__(self, ranks: int, device: str, setup_args: tuple):
        """setup_args: (RunContext, marker file name, armed failpoints, step queue); the process-group backend
        follows the device (NCCL on CUDA, gloo on CPU)."""
        import ray

        self.ranks = ranks
        self.device = device
        self.setup_args = (*setup_args, "nccl" if device == "cuda" else "gloo")
        self.resources = {"num_gpus": 1, "num_cpus": 1} if device == "cuda" else {"num_cpus": 1}
        self.bundle = {"GPU": 1, "CPU": 1} if device == "cuda" else {"CPU": 1}
        self.actor_class = ray.remote(RankWorker)

    def start(self) -> tuple[list[Any], Any, list[Any]]:
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        group = placement_group([dict(self.bundle) for _ in range(self.ranks)], strategy="STRICT_PACK")
        actors = [
            self.actor_class.options(
                scheduling_strategy=PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=rank),
                **self.resources,
            ).remote(rank, self.ranks)
            for rank in range(self.ranks)
        ]
        places = [actor.place.remote() for actor in actors]
        # Object refs as arguments: Ray runs each setup once every rank's place is known.
        return actors, group, [actor.setup.remote(*self.setup_args, *places) for actor in actors]

    def run(self, actors: list[Any], pj: PlannedJob, attempt: int) -> list[Any]:
        return [actor.run.remote(pj, attempt) for actor in actors]

    def stop(self, actors: list[Any], group: Any) -> None:
        import ray
        from ray.util.placement_group import remove_placement_group

        for actor in actors:
            try:
                ray.kill(actor, no_restart=True)
            except Exception:  # already gone
                log.debug("could not kill a rank", exc_info=True)
        if group is not None:
            try:
                remove_placement_group(group)  # frees the bundles for the group that replaces it
            except Exception:
                log.debug("could not remove a placement group", exc_info=True)
