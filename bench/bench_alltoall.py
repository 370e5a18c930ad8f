#!/usr/bin/env python
"""All-to-all bandwidth between the GPUs of one host at Ulysses' message sizes (issue 6).

One CogVideoX-5B step on 2 ranks exchanges, per layer and rank, q/k/v of its shard (3 x 2 x 48 x 8888
x 64 bf16 = 164 MB) and the attention output (55 MB). This times `all_to_all_single` at those sizes
(median of --repeats, after warm-up) and prints the bus bandwidth NCCL reaches, so the Ulysses
step's communication can be compared with what the link allows. Run with NCCL_DEBUG=INFO to see
the transport NCCL chose (P2P/NVLink, SHM, ...).

    torchrun --standalone --nproc-per-node 2 bench/bench_alltoall.py
"""

from __future__ import annotations

import argparse
import os
import statistics

import torch
import torch.distributed as dist


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes-mb", default="164,55,16")
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    dist.init_process_group("nccl", device_id=torch.device("cuda", torch.cuda.current_device()))
    for size_mb in map(float, args.sizes_mb.split(",")):
        numel = int(size_mb * 1e6) // 2 // world * world
        send = torch.randn(numel, device="cuda", dtype=torch.bfloat16)
        recv = torch.empty_like(send)
        times = []
        for i in range(args.repeats + 3):
            dist.barrier(device_ids=[torch.cuda.current_device()])
            torch.cuda.synchronize()
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            dist.all_to_all_single(recv, send)
            stop.record()
            torch.cuda.synchronize()
            if i >= 3:
                times.append(start.elapsed_time(stop))
        ms = statistics.median(times)
        moved = send.numel() * 2 * (world - 1) / world  # bytes each rank sends to the others
        if rank == 0:
            print(f"all_to_all {size_mb:g} MB per rank: {ms:.3f} ms, {moved / ms / 1e6:.0f} GB/s sent per rank",
                  flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
