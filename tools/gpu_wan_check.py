#!/usr/bin/env python3
"""On a GPU: the tiny Wan models through `sagevideo.generate` with the Triton kernels (bf16).

For tiny-wan22 (both Wan 2.2 A14B denoisers), tiny-wan-i2v (CLIP image tokens in cross-attention)
and tiny-wan22-ti2v (an image through WanImageToVideoPipeline), at 128x128 px and 17 frames (5 x 8
x 8 = 320 video tokens; TI2V: 80), 512 text keys: every attention call ran on Triton with no fallback
(recorded backends), and how far each P·V mode's frames are from full precision with the same
seed. One line per model and mode.

    python3 tools/gpu_wan_check.py [OUT_DIR] [--device cpu]   (cpu: the emulation, a smoke test of this script)
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image

import sagevideo
from sagevideo.outputs.video import read_frames

SIZE = {"frames": 17, "height": 128, "width": 128, "steps": 4}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", nargs="?", type=Path, default=None)
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="wan-gpu-"))
    device, backend = args.device, "triton" if args.device == "cuda" else "reference"
    still = out / "still.png"
    out.mkdir(parents=True, exist_ok=True)
    Image.fromarray((np.random.default_rng(0).random((128, 128, 3)) * 255).astype(np.uint8)).save(still)
    failures = 0
    for model, image in (("tiny-wan22", None), ("tiny-wan-i2v", still), ("tiny-wan22-ti2v", still)):
        job = {"prompt": "a red fox running through snow", **SIZE, **({"image": str(image)} if image else {})}
        full = sagevideo.generate([{**job, "attention": "full", "output": "full"}], out=out / model, model=model,
                                  device=device, progress=False)[0]
        reference = read_frames(out / model / full.outputs[0]).astype(np.int16)
        for pv in ("fp16", "fp8"):
            record = sagevideo.generate([{**job, "pv": pv, "output": pv}], out=out / model, model=model,
                                        device=device, backend=backend, progress=False)[0]
            frames = read_frames(out / model / record.outputs[0]).astype(np.int16)
            ran, fallbacks = record.backends["counts"], record.backends["fallbacks"]
            ok = record.status == "done" and not fallbacks and set(ran) == {f"{backend}/{pv}"}
            failures += not ok
            print(f"{model:16s} pv={pv}: {record.status}, {record.dtype}, ran {ran}, fallbacks {fallbacks}; "
                  f"frames vs full precision: mean |diff| {np.abs(frames - reference).mean():.3f} levels, "
                  f"max {np.abs(frames - reference).max()}" + ("" if ok else f"  <-- NOT ALL ON {backend.upper()}"))
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
