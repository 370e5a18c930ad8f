"""Ulysses sequence parallelism: all-to-all between sequence shards and head groups.

Each of P ranks holds (B, H, N/P, D) q/k/v for its sequence shard. `seq_to_heads` exchanges them
so each rank holds all N tokens of H/P heads; attention then runs locally (any kernel: sagevideo's
quantized attention sees exactly the inputs it would see on one GPU, per head); `heads_to_seq`
returns the output to sequence shards. Two all-to-alls of q/k/v/o per attention call, no
approximation. Tokens replicated on every rank (e.g. CogVideoX's text) skip the exchange:
`local_heads` slices them and `gather_heads` reassembles their output.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def check_degree(heads: int, sharded_tokens: int, degree: int, what: str = "video tokens") -> None:
    """Raise ValueError unless `degree` ranks can split `heads` and `sharded_tokens` evenly."""
    if degree < 1:
        raise ValueError(f"sequence-parallel degree must be >= 1, got {degree}")
    problems = []
    if heads % degree:
        divisors = [d for d in range(1, heads + 1) if heads % d == 0 and sharded_tokens % d == 0]
        problems.append(f"{heads} attention heads are not divisible by {degree} (usable degrees: {divisors})")
    if sharded_tokens % degree:
        problems.append(f"{sharded_tokens} {what} are not divisible by {degree}; change frames/size or the degree")
    if problems:
        raise ValueError("Ulysses degree " + str(degree) + ": " + "; ".join(problems))


def seq_to_heads(x: torch.Tensor, group=None) -> torch.Tensor:
    """(B, H, n, D) sequence shard -> (B, H/P, P·n, D): all tokens of this rank's head group."""
    world = dist.get_world_size(group)
    b, h, n, d = x.shape
    send = x.reshape(b, world, h // world, n, d).transpose(0, 1).contiguous()  # chunk p -> rank p
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)  # recv[p]: rank p's sequence shard of my heads
    return recv.permute(1, 2, 0, 3, 4).reshape(b, h // world, world * n, d)


def heads_to_seq(x: torch.Tensor, group=None) -> torch.Tensor:
    """(B, H/P, N, D) head group -> (B, H, N/P, D): this rank's sequence shard of all heads."""
    world = dist.get_world_size(group)
    b, h, n_all, d = x.shape
    n = n_all // world
    send = x.reshape(b, h, world, n, d).permute(2, 0, 1, 3, 4).contiguous()  # shard p -> rank p
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)  # recv[p]: my shard of rank p's heads
    return recv.transpose(0, 1).reshape(b, world * h, n, d)


def local_heads(x: torch.Tensor, group=None) -> torch.Tensor:
    """(B, H, N, D) replicated tokens -> (B, H/P, N, D): this rank's head group."""
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    h = x.shape[1] // world
    return x[:, rank * h : (rank + 1) * h]


def gather_heads(x: torch.Tensor, group=None) -> torch.Tensor:
    """(B, H/P, N, D) per rank -> (B, H, N, D) on every rank."""
    parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, x.contiguous(), group=group)
    return torch.cat(parts, dim=1)


def gather_seq(x: torch.Tensor, group=None, dim: int = 1) -> torch.Tensor:
    """Sequence shards (…, n, …) along `dim` -> the full sequence on every rank."""
    parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, x.contiguous(), group=group)
    return torch.cat(parts, dim=dim)


def ulysses_attention(attend, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, text_len: int,
                      group=None) -> torch.Tensor:
    """Attention over [replicated text; sharded video] tokens, (B, H, T + n, D) per rank.

    Video q/k/v are exchanged to all tokens × H/P heads, text q/k/v sliced to the same heads;
    `attend(q, k, v)` runs on (B, H/P, T + N, D); the output goes back to (B, H, T + n, D).
    """
    gathered = [
        torch.cat([local_heads(t[:, :, :text_len], group), seq_to_heads(t[:, :, text_len:], group)], dim=2)
        for t in (query, key, value)
    ]
    out = attend(*gathered)
    return torch.cat([gather_heads(out[:, :, :text_len], group), heads_to_seq(out[:, :, text_len:], group)], dim=2)


class SequenceParallelHandle:
    """Installed sequence parallelism on one transformer; `remove()` undoes hooks and processors."""

    def __init__(self, attention, hooks):
        self.attention = attention
        self._hooks = hooks

    def remove(self) -> None:
        for hook in self._hooks:
            hook.remove()
        self._hooks = []
        self.attention.remove()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.remove()
