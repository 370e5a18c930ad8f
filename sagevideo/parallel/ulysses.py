"""Ulysses sequence parallelism: all-to-all between sequence shards and head groups.

Each of P ranks holds (B, H, N/P, D) q/k/v for its sequence shard. `ulysses_attention` exchanges
them (one all-to-all for q, k and v) so each rank holds all N tokens of H/P heads; attention then
runs locally (any kernel: sagevideo's quantized attention sees exactly the inputs it would see on
one GPU, per head); a second all-to-all returns the output to sequence shards. No approximation.
The buffers are token-major, so the received q/k/v are strided views (no copy) and the kernels'
output goes back as it is (`ulysses_exchange`). Tokens replicated on every rank (Open-Sora's text
in front of the video, HunyuanVideo's after it: `text_last`; CogVideoX shards its text with the
video) skip the exchange: they are sliced to the rank's heads and their output is reassembled
with `gather_heads`.

`heads` (optional; `local_heads`, `ulysses_attention`, `ulysses_exchange`): a head order, int64 (H,)
on the inputs' device, so that rank r attends to heads heads[r·H/P : (r+1)·H/P] instead of
r·H/P .. (r+1)·H/P - 1 (`parallel.balance`: ranks balanced by block-sparse density); the output is in
the heads' own order. It costs one gather of the video q/k/v and one scatter of the output.
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


def local_heads(x: torch.Tensor, group=None, heads: torch.Tensor | None = None) -> torch.Tensor:
    """(B, H, N, D) replicated tokens -> (B, H/P, N, D): this rank's head group (of `heads`' order)."""
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    h = x.shape[1] // world
    if heads is not None:
        return x.index_select(1, heads[rank * h : (rank + 1) * h])
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


def gather_uneven(x: torch.Tensor, sizes: list[int], group=None, dim: int = 1) -> torch.Tensor:
    """Shards of `sizes[r]` along `dim` (rank r's) -> the whole sequence on every rank.

    Collectives move equal sizes, so each shard travels padded to the largest and is trimmed.
    """
    largest = max(sizes)
    if all(size == largest for size in sizes):
        return gather_seq(x, group, dim)
    pad = list(x.shape)
    pad[dim] = largest - x.shape[dim]
    padded = torch.cat([x, x.new_zeros(pad)], dim=dim) if pad[dim] else x
    parts = gather_seq(padded, group, dim).split(largest, dim=dim)
    return torch.cat([part.narrow(dim, 0, size) for part, size in zip(parts, sizes, strict=True)], dim=dim)


# Head chunks pipelined through the exchanges (see ulysses_exchange); exact for any count
# (tests/parallel). Measured on 2 H200s at CogVideoX-5B size with the earlier copying buffers
# (docs/benchmarks-history.md): 1 / 2 / 4 chunks = 1.82x / 1.83x / 1.80x, the transfer being a small part
# of the step. 1 keeps attention calls whole (2 gained 0.5%, and halves each call's grid).
HEAD_CHUNKS = 1


def send_buffer(like: torch.Tensor, n: int, group=None, chunks: int | None = None) -> torch.Tensor:
    """Empty all-to-all send buffer for `ulysses_exchange`: (chunks, P, n, 3, B, hc, D), like's dtype
    and device, for q/k/v like (B, H, *, D) with n sharded tokens per rank; hc = H / (P · chunks).

    chunks: head chunks pipelined through the exchanges (None: HEAD_CHUNKS; fewer when H/P does
    not divide). send[c, p]: this rank's n tokens for chunk c of head group p, token-major (each
    token's q, k, v of every batch and head together), so that what a rank receives from all
    ranks, in rank order, is the whole sequence with one token stride: q/k/v are views of the
    receive buffer, not copies (`ulysses_exchange`). Fill it through `send_slot`.
    """
    world = dist.get_world_size(group)
    b, h, _, d = like.shape
    hp = h // world
    chunks = HEAD_CHUNKS if chunks is None else chunks
    chunks = max(c for c in range(1, min(chunks, hp) + 1) if hp % c == 0)
    return like.new_empty(chunks, world, n, 3, b, hp // chunks, d)


def send_slot(send: torch.Tensor, i: int) -> torch.Tensor:
    """Writable (B, P, chunks, hc, n, D) view of tensor i (0 q, 1 k, 2 v) in `send_buffer`'s buffer:
    a (B, H, n, D) tensor t goes in as `send_slot(send, i).copy_(t.unflatten(1, (P, chunks, hc)))`
    (head h = p·H/P + c·hc + j; `slot.shape[1:4]` is that split). Producers of q/k/v can write their
    results here directly instead of copying them in."""
    return send[:, :, :, i].permute(3, 1, 0, 4, 2, 5)


def ulysses_attention(attend, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, text_len: int,
                      group=None, chunks: int | None = None, text_last: bool = False,
                      heads: torch.Tensor | None = None) -> torch.Tensor:
    """Attention over [replicated text; sharded video] tokens, (B, H, T + n, D) per rank; with
    text_last, over [sharded video; replicated text] (B, H, n + T, D), attention's own order too.

    Copies the video q/k/v into a `send_buffer` (once each; in `heads`' order where given) and runs
    `ulysses_exchange`; callers that can produce q/k/v in place fill the buffer themselves.
    """
    n = query.shape[2] - text_len
    video, text_part = (slice(0, n), slice(n, None)) if text_last else (slice(text_len, None), slice(0, text_len))
    send = send_buffer(query, n, group, chunks)
    for i, t in enumerate((query, key, value)):
        slot = send_slot(send, i)
        t = t[:, :, video]
        slot.copy_((t if heads is None else t.index_select(1, heads)).unflatten(1, slot.shape[1:4]))
    text = tuple(t[:, :, text_part] for t in (query, key, value)) if text_len else None
    return ulysses_exchange(attend, send, text, group, text_last=text_last, heads=heads)


def ulysses_exchange(attend, send: torch.Tensor, text: tuple[torch.Tensor, ...] | None = None,
                     group=None, text_last: bool = False, heads: torch.Tensor | None = None) -> torch.Tensor:
    """Exchange, attention and return exchange for a filled `send_buffer` -> (B, H, T + n, D).

    send holds this rank's n sharded tokens; text: None or replicated (B, H, T, D) q/k/v, sliced
    to this rank's heads. Video q/k/v are exchanged to all tokens × H/P heads; `attend(q, k, v)`
    runs on (B, hc, T + P·n, D) for each chunk of this rank's H/P heads; the output goes back
    to (B, H, T + n, D). Data movement only (bit-exact: attention is per head). text_last: the
    text comes after the video, in what `attend` sees ([all video; text]) and in the output
    ((B, H, n + T, D)). heads: the order the send buffer holds the heads in (None: their own), which
    the text's slices follow and the output is put back from.

    No copies on the attention side: the buffer is token-major, so the received q/k/v are
    strided (B, hc, S, D) views of it (unit stride on D, what the kernels take), and the kernels'
    output (`empty_like(q)`: token-major too) is already the return exchange's send buffer. What
    is left: q/k/v into the send buffer (written there by their producer) and the returned output
    into (B, T + n, H, D). Pipelined over the buffer's head chunks: every chunk's q/k/v all-to-all
    is issued up front, so while chunk c is attended the next chunk's inputs and the previous
    chunk's output are in flight on NCCL's stream.
    """
    chunks, world, n, _, b, hc, d = send.shape
    hp = chunks * hc
    h = world * hp
    text_len = 0 if text is None else text[0].shape[2]
    # Where the text and the video are: in what attend sees (all P·n video tokens) and in the result (n).
    if text_last:
        seen_text, seen_video = slice(world * n, None), slice(0, world * n)
        own_text, own_video = slice(n, None), slice(0, n)
    else:
        seen_text, seen_video = slice(0, text_len), slice(text_len, None)
        own_text, own_video = slice(0, text_len), slice(text_len, None)
    # recv[c]: [replicated text; rank 0's shard; rank 1's shard; ...] of my chunk-c heads, token-major
    # (text_last: [rank 0's shard; ...; text]).
    recv = send.new_empty(chunks, text_len + world * n, 3, b, hc, d)
    exchanges = [dist.all_to_all_single(recv[c, seen_video], send[c], group=group, async_op=True)
                 for c in range(chunks)]
    for i, t in enumerate([local_heads(t, group, heads) for t in text] if text_len else []):
        for c in range(chunks):
            recv[c, seen_text, i].copy_(t[:, c * hc : (c + 1) * hc].permute(2, 0, 1, 3))
    # (B, H, T + n, D) view of (B, T + n, H, D) memory: the caller's transpose(1, 2).reshape to
    # (B, T + n, H·D) before the output projection is then a view, not another copy.
    result = send.new_empty(b, text_len + n, h, d).transpose(1, 2)
    text_out = send.new_empty(b, hp, text_len, d)
    returns = []
    for c, work in enumerate(exchanges):
        work.wait()
        out = attend(*(recv[c, :, i].permute(1, 2, 0, 3) for i in range(3)))
        text_out[:, c * hc : (c + 1) * hc] = out[:, :, seen_text]
        # send_o[p·n : (p+1)·n]: my chunk-c heads' output for rank p's tokens -> rank p. A view when
        # the output is token-major (the kernels'), else one copy (SDPA, the reference).
        send_o = out[:, :, seen_video].permute(2, 0, 1, 3).contiguous()
        recv_o = torch.empty_like(send_o)
        returns.append((dist.all_to_all_single(recv_o, send_o, group=group, async_op=True), send_o, recv_o))
    ordered = result if heads is None else torch.empty_like(result)  # heads in the send buffer's order
    video = ordered[:, :, own_video].unflatten(1, (world, hp))
    for c, (work, _, recv_o) in enumerate(returns):
        work.wait()  # recv_o[p·n : (p+1)·n]: my tokens' output of chunk c of head group p
        video[:, :, c * hc : (c + 1) * hc].copy_(recv_o.unflatten(0, (world, n)).permute(2, 0, 3, 1, 4))
    if text_len:
        ordered[:, :, own_text] = gather_heads(text_out, group)
    if heads is not None:
        result.index_copy_(1, heads, ordered)
    return result


def ulysses_query_attention(attend, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                            group=None) -> torch.Tensor:
    """Attention of sharded queries to keys/values every rank holds whole (cross-attention to
    replicated text): query (B, H, n, D) of this rank's n tokens, key/value (B, H, M, D) -> (B, H, n, D).

    The queries are exchanged to all P·n tokens × H/P heads (one all-to-all), keys/values sliced to
    those heads, `attend(q, k, v)` runs on (B, H/P, P·n, D) queries, and the output goes back (a
    second all-to-all). Local attention of the n queries gives the same result in exact arithmetic;
    this is for attention whose numerics depend on the query sequence as a whole (sagevideo's
    per-block INT8 scales of Q: a block of the full sequence is not a block of a shard), so that
    each head sees exactly one process's inputs. Data movement only.
    """
    world = dist.get_world_size(group)
    b, h, n, d = query.shape
    hp = h // world
    # send[p]: my n tokens of head group p, token-major; recv[p]: rank p's n tokens of my heads.
    send = query.unflatten(1, (world, hp)).permute(1, 3, 0, 2, 4).contiguous()  # (P, n, B, hp, D)
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)
    out = attend(recv.flatten(0, 1).permute(1, 2, 0, 3), local_heads(key, group), local_heads(value, group))
    send_o = out.permute(2, 0, 1, 3).contiguous()  # (P·n, B, hp, D): rank p's tokens at [p·n, (p+1)·n)
    recv_o = torch.empty_like(send_o)
    dist.all_to_all_single(recv_o, send_o, group=group)  # recv_o[p·n : (p+1)·n]: my tokens, head group p
    return recv_o.unflatten(0, (world, n)).permute(2, 0, 3, 1, 4).reshape(b, h, n, d)


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
