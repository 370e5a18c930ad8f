"""Process groups from torchrun-style variables (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT).

The same code runs under `torchrun` and under Ray actors that set those variables. Code outside
`sagevideo.parallel` asks here (`rank_and_world`, `leave_group`, `mean_and_least_over_ranks`) instead of calling
torch.distributed itself.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist


def init_from_env(backend: str | None = None) -> tuple[int, int]:
    """Initialise the default process group if needed; returns (rank, world size).

    backend: "nccl" on CUDA, else "gloo" (CPU tests) when None. Raises a clear error when the
    variables are missing.
    """
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    missing = [v for v in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if v not in os.environ]
    if missing:
        raise RuntimeError(
            f"sequence parallelism needs torchrun-style variables; missing {missing}. Start with "
            "`torchrun --nproc-per-node N -m sagevideo.generation.torchrun ...` or let "
            "`sagevideo generate --gpus-per-job N` set them."
        )
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend)
    return dist.get_rank(), dist.get_world_size()


def rank_and_world(group=None) -> tuple[int, int]:
    """(this process's rank, the group's size) in `group` (None: the default process group)."""
    return dist.get_rank(group), dist.get_world_size(group)


def leave_group() -> None:
    """Close the default process group if there is one (torch warns at exit otherwise)."""
    if dist.is_initialized():
        dist.destroy_process_group()


def mean_and_least_over_ranks(mean: torch.Tensor, least: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(`mean` averaged over the ranks of the default process group, the least of `least` over them),
    elementwise, new tensors equal on every rank; in one process (no group, or a group of one) `mean` and
    `least` themselves. Every rank of the group must call it at the same point (two all-reduces)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return mean, least
    mean, least = (torch.clone(t, memory_format=torch.contiguous_format) for t in (mean, least))
    dist.all_reduce(mean)
    dist.all_reduce(least, op=dist.ReduceOp.MIN)
    return mean / dist.get_world_size(), least
