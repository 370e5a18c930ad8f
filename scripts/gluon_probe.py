#!/usr/bin/env python3
"""What the installed Triton's Gluon offers on this GPU, for the warp-specialized sm90 kernel.

Checks, each independently (an error is reported, not raised):
- the Hopper names the kernel needs exist (TMA descriptor, mbarrier, warpgroup MMA, warp_specialize);
- one warpgroup MMA of a 64x64 tile with K=64 compiles and is exact, for the three operand types the
  attention kernel uses: fp16 x fp16 -> fp32, int8 x int8 -> int32 (Q·Kᵀ), e4m3 x e4m3 -> fp32 (P·V).
  The B tile is loaded K-major ((N, K) in memory, permuted in shared memory), which 8-bit WGMMA needs.

    python3 scripts/gluon_probe.py --json probe.json
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys

import torch
import triton

NEEDED = {
    "triton.experimental.gluon": ["jit", "constexpr_function"],
    "triton.experimental.gluon.language": ["NVMMASharedLayout", "NVMMADistributedLayout", "allocate_shared_memory",
                                           "warp_specialize", "DotOperandLayout"],
    "triton.experimental.gluon.language.nvidia.hopper": ["tma", "mbarrier", "warpgroup_mma", "warpgroup_mma_wait",
                                                         "fence_async_shared"],
    "triton.experimental.gluon.nvidia.hopper": ["TensorDescriptor"],
}


def available_names() -> dict:
    """module -> {name: present?}, plus the tma module's copy functions (renamed across versions)."""
    import importlib

    found: dict = {}
    for module_name, names in NEEDED.items():
        try:
            module = importlib.import_module(module_name)
        except Exception as exc:  # the module itself is missing
            found[module_name] = f"import failed: {exc}"
            continue
        found[module_name] = {name: hasattr(module, name) for name in names}
    try:
        from triton.experimental.gluon.language.nvidia.hopper import tma

        found["tma functions"] = sorted(n for n in dir(tma) if not n.startswith("_"))
        from triton.experimental import gluon

        found["warp_specialize signature"] = str(inspect.signature(gluon.language.warp_specialize))
    except Exception as exc:
        found["tma functions"] = f"failed: {exc}"
    return found


def build_kernel():
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        mbarrier,
        tma,
        warpgroup_mma,
        warpgroup_mma_wait,
    )

    @gluon.jit
    def tile_mma_kernel(a_desc, b_desc, c_ptr, ACC_INT: gl.constexpr, num_warps: gl.constexpr):
        """C (M, N) = A (M, K) · Bᵀ where B is stored (N, K): one TMA load each, one warpgroup MMA."""
        M: gl.constexpr = a_desc.block_type.shape[0]
        K: gl.constexpr = a_desc.block_type.shape[1]
        N: gl.constexpr = b_desc.block_type.shape[0]
        bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        mbarrier.init(bar, count=1)
        a_smem = gl.allocate_shared_memory(a_desc.dtype, [M, K], a_desc.layout)
        b_smem = gl.allocate_shared_memory(b_desc.dtype, [N, K], b_desc.layout)
        mbarrier.expect(bar, a_desc.block_type.nbytes + b_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(a_desc, [0, 0], bar, a_smem)
        tma.async_copy_global_to_shared(b_desc, [0, 0], bar, b_smem)
        mbarrier.wait(bar, phase=0)
        mbarrier.invalidate(bar)
        layout: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, N, 256 // a_desc.dtype.primitive_bitwidth]
        )
        acc = gl.zeros((M, N), dtype=gl.int32 if ACC_INT else gl.float32, layout=layout)
        acc = warpgroup_mma(a_smem, b_smem.permute((1, 0)), acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        fence_async_shared()
        store_layout: gl.constexpr = gl.BlockedLayout([1, 4], [4, 8], [num_warps, 1], [1, 0])
        out = gl.convert_layout(acc, store_layout)
        rows = gl.arange(0, M, layout=gl.SliceLayout(1, store_layout))
        cols = gl.arange(0, N, layout=gl.SliceLayout(0, store_layout))
        gl.store(c_ptr + rows[:, None] * N + cols[None, :], out)

    return tile_mma_kernel


def check_mma(kernel, dtype: torch.dtype) -> dict:
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    gl_dtype = {torch.float16: gl.float16, torch.int8: gl.int8, torch.float8_e4m3fn: gl.float8e4nv}[dtype]
    m = n = k = 64
    gen = torch.Generator("cuda").manual_seed(0)
    if dtype == torch.int8:
        a = torch.randint(-127, 128, (m, k), device="cuda", generator=gen, dtype=torch.int32).to(dtype)
        b = torch.randint(-127, 128, (n, k), device="cuda", generator=gen, dtype=torch.int32).to(dtype)
        want = a.double() @ b.double().T
    else:
        a = torch.randn(m, k, device="cuda", generator=gen).to(dtype)
        b = torch.randn(n, k, device="cuda", generator=gen).to(dtype)
        want = a.double() @ b.double().T
    c = torch.empty(m, n, device="cuda", dtype=torch.int32 if dtype == torch.int8 else torch.float32)
    descs = []
    for t in (a, b):
        layout = gl.NVMMASharedLayout.get_default_for(list(t.shape), gl_dtype)
        descs.append(TensorDescriptor(t, list(t.shape), list(t.stride()), list(t.shape), layout))
    kernel[(1,)](*descs, c, dtype == torch.int8, num_warps=4)
    torch.cuda.synchronize()
    err = (c.double() - want).abs().max().item()
    return {"ok": err <= (0 if dtype == torch.int8 else 1e-3 * want.abs().max().item()), "max_abs_err": err}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json")
    args = parser.parse_args()
    report: dict = {"triton": triton.__version__, "torch": torch.__version__}
    report["names"] = available_names()
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0):
        report["mma"] = "skipped: needs a Hopper GPU"
    else:
        report["gpu"] = torch.cuda.get_device_name()
        report["mma"] = {}
        try:
            kernel = build_kernel()
        except Exception as exc:
            report["mma"] = f"kernel definition failed: {type(exc).__name__}: {exc}"
        else:
            for dtype in (torch.float16, torch.int8, torch.float8_e4m3fn):
                try:
                    report["mma"][str(dtype)] = check_mma(kernel, dtype)
                except Exception as exc:  # record the first lines: that is the fact we are after
                    report["mma"][str(dtype)] = {"ok": False, "error": f"{type(exc).__name__}: " +
                                                 " | ".join(str(exc).splitlines()[:6])[:600]}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
