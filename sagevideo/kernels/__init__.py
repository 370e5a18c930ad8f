"""Quantized attention kernels (Triton), their op boundary, plans per arch, and the reference.

Modules, one job each:
- `plans`: which kernel configuration runs on which device and head dim, and why not;
- `reference`: pure-PyTorch emulation of the exact kernel numerics (the test oracle);
- `quantize`: Triton kernels that smooth K and quantize Q/K (INT8) and V (FP8);
- `attention_fwd`: the Triton attention forward kernel (INT8 QK, FP16/FP8 PV);
- `op`: the `torch.library` op `sagevideo::sageattn_fwd` that chains the two.

Only `plans` and `reference` import without triton.
"""
