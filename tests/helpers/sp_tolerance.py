"""What "the same video as one process" means for sequence-parallel runs (Ray groups, torchrun).

Ulysses moves activations exactly; the sharded transformer differs from one process only by fp32
summation order (linear layers over a shard of the tokens instead of all of them): the latents
differ by ~1e-6 (tests/parallel/test_ulysses.py bounds the transformer at 1e-5).
- attention "full": that never moves a uint8 pixel here, and H.264 encoding is deterministic,
  so the mp4 files are byte-identical;
- sagevideo's quantized attention: a ~1e-6 change in Q or K can flip one INT8 rounding, which
  moves a few pixels by one level (raw frames: max 1 of 255, seen on the CPU with the script
  that became tests/generation/test_torchrun_gpu.py), and H.264 spreads such a change over its
  block. The decoded frames must then
  agree to a mean of MEAN_LEVELS levels of 255 (measured: 0.5 on the tiny model), not bit for
  bit. (On 2 GPUs with the Triton kernels the raw frames were bit-identical: docs/scheduling.md.)
A helper module, not a conftest: tests/scheduling and tests/generation use it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

MEAN_LEVELS = 1.5

# Three jobs named by output: quantized attention, full attention, and one a failpoint can
# target by its prompt ("KILL").
JOBS = (
    "defaults:\n  steps: 2\njobs:\n"
    "  - prompt: a cat on a red sofa\n    output: sage\n"
    "  - prompt: a dog in the snow\n    output: full\n    attention: full\n"
    "  - prompt: KILL a fox at dusk\n    output: killed\n"
)
FULL = ("full.mp4",)
QUANTIZED = ("sage.mp4", "killed.mp4")


def frames(path: Path) -> np.ndarray:
    import imageio.v2 as imageio

    return np.stack(list(iter(imageio.get_reader(path)))).astype(np.int16)  # iterate: its length is unknown


def assert_same_videos(sharded: Path, single: Path) -> None:
    """The outputs in `sharded` are those of `single` within the tolerance above."""
    for name in FULL:
        assert (sharded / name).read_bytes() == (single / name).read_bytes(), name
    for name in QUANTIZED:
        a, b = frames(sharded / name), frames(single / name)
        assert a.shape == b.shape, name
        diff = np.abs(a - b).mean()
        assert diff <= MEAN_LEVELS, (name, diff)
