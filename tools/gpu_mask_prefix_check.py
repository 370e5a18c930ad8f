#!/usr/bin/env python3
"""A key mask's cost in the plain kernel, at HunyuanVideo's self-attention shape (GPU, one run).

HunyuanVideo's self-attention carries a key mask: its text padding, the last keys of the joint
[video; text] sequence. The plain kernel skips the mask check on the tiles before each row's first
masked key (`attention_fwd.valid_prefix`). This times, side by side (round-robin medians):
  - sageattn with that padding mask (all but the last tiles unchecked),
  - the same mask with key 0 also masked (every tile checked: the cost before valid_prefix),
  - SDPA cuDNN with the padding mask,
and prints the worst cosine of the padding-mask output against fp32 SDPA on sampled rows.

    python3 tools/gpu_mask_prefix_check.py [--tokens 119056] [--valid 118900] [--reps 5]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--heads", type=int, default=24)
    parser.add_argument("--tokens", type=int, default=118800 + 256, help="video + text tokens (HunyuanVideo 720p)")
    parser.add_argument("--valid", type=int, default=118800 + 100, help="leading valid keys (video + real text)")
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from bench.bench_attention import bench_interleaved
    from sagevideo import last_backend, sageattn

    torch.manual_seed(0)
    shape = (1, args.heads, args.tokens, 128)
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    padding = torch.ones(1, args.tokens, dtype=torch.bool, device="cuda")
    padding[:, args.valid:] = False
    every_tile = padding.clone()
    every_tile[:, 0] = False
    calls = {
        "sage-padding-mask": lambda: sageattn(q, k, v, attn_mask=padding[:, None, None, :]),
        "sage-every-tile-checked": lambda: sageattn(q, k, v, attn_mask=every_tile[:, None, None, :]),
    }

    def cudnn():
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=padding[:, None, None, :])

    calls["sdpa-cudnn-padding-mask"] = cudnn
    out = calls["sage-padding-mask"]()
    backend = last_backend().label
    rows = torch.linspace(0, args.tokens - 1, 512, device="cuda").long()
    ref = torch.nn.functional.scaled_dot_product_attention(
        q[:, :, rows].float(), k.float(), v.float(), attn_mask=padding[:, None, None, :])
    cos = torch.nn.functional.cosine_similarity(out[:, :, rows].double().flatten(2),
                                                ref.double().flatten(2), dim=-1).min().item()
    ms, _, errors = bench_interleaved(calls, args.reps)
    if errors:
        raise SystemExit(f"gpu_mask_prefix_check: calls failed: {errors}")
    cudnn_ms = ms["sdpa-cudnn-padding-mask"]
    for name, t in ms.items():
        print(f"{name:26s} {t:8.2f} ms  x cuDNN {cudnn_ms / t:.3f}")
    print(f"gpu_mask_prefix_check: {shape}, {args.valid} valid keys, backend {backend}, worst cosine {cos:.5f}; "
          f"padding mask {ms['sage-every-tile-checked'] / ms['sage-padding-mask']:.3f}x the every-tile-checked call")
    return 0 if cos >= 0.998 else 1


if __name__ == "__main__":
    sys.exit(main())
