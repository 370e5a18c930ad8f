"""Process groups from torchrun-style variables (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT).

The same code runs under `torchrun` and under Ray actors that set those variables. Code outside
`sagevideo.parallel` asks here (`rank_and_world`, `leave_group`, `job_size`, `reduce_over_ranks`) instead of calling
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


def job_size() -> int:
    """The ranks of the default process group (the job's, as sagevideo launches one); 1 without a group."""
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def reduce_over_ranks(t: torch.Tensor, op: str) -> torch.Tensor:
    """`t` reduced elementwise over the ranks of the default process group ("sum", "min" or "max"): a new
    tensor, equal on every rank; `t` itself in one process. Every rank must call it at the same point."""
    if job_size() == 1:
        return t
    out = torch.clone(t, memory_format=torch.contiguous_format)
    dist.all_reduce(out, op={"sum": dist.ReduceOp.SUM, "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX}[op])
    return out
