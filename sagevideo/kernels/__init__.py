"""Quantized attention kernels (Triton), their op boundary, plans per arch, and the reference.

The only package that imports triton. Modules, one job each:
- `plans`: the tuning tables (`KernelPlan` for the attention kernels, `PrepPlan` for the
  preparation), which kernel configuration runs on which device and head dim, and why not;
- `constants`: the numeric constants the kernels and the reference share;
- `reference`: pure-PyTorch emulation of the exact kernel numerics (the test oracle);
- `rotation`: the random-sign Hadamard matrix Q and K are rotated by;
- `quantize`: Triton kernels that smooth K and quantize Q/K (INT8) and V (FP8);
- `attention_fwd`: the plain-Triton attention forward kernel (INT8 QK, FP16/FP8 PV);
- `attention_sm90`: the warp-specialized Hopper attention kernel in Gluon (FP8 PV);
- `sparse_reference`, `tile_select`: block-sparse tile masks, their lists and oracle; choosing tiles
  in PyTorch (the definition);
- `tile_select_kernel`: the dynamic tile selection on the device, from the statistics `quantize`
  pools;
- `op`: the `torch.library` ops that chain preparation and attention: `sagevideo::sageattn_fwd`
  (plain Triton, a triton_op Inductor traces into; `sageattn_fwd_select` the same with the tile
  selection in between) and `sagevideo::sageattn_fwd_gluon` (the Gluon kernel, a custom op opaque
  to Inductor).

`plans`, `constants`, `reference`, `rotation`, `sparse_reference` and `tile_select` import without triton.
"""
