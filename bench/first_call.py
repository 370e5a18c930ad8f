#!/usr/bin/env python
"""Where a compiled recipe's first call goes (issue 21): CogVideoX-5B's block shapes, fewer blocks.

Builds CogVideoX-5B's transformer (random weights, bf16, batch 2 = CFG, 49 frames 480x720) with
--layers blocks instead of 42, applies the recipe through `sagevideo.pipelines.recipe.apply_recipe`
(sage attention installed, --linear, regional compile), then times the first forward block by
block (each block wrapped by an uncompiled timer that synchronizes the GPU around it) under
cProfile, and a second forward. It prints each block's first-call seconds, Dynamo's graph counts
and compile_times(), and the profile's top functions by cumulative and own time (the .prof file
under --out). A first call that pays once per graph shows in block 0 (and block 1, whose input
strides differ); one that pays per block shows in every block.

    python -m bench.first_call --layers 4 --linear fp8 --out /tmp/first-call     # GPU
    python -m bench.first_call --tiny --linear bf16 --compile-backend eager        # CPU smoke test
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import sys
import time
from pathlib import Path

if not __package__:  # run as a file: `bench` from the repo root, as with -m
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


class TimedBlock:
    """Calls `block` and appends its seconds (GPU synchronized on both sides) to `seconds`."""

    def __init__(self, block, seconds: list[float], sync, say=None):
        self.block, self.seconds, self.sync, self.say = block, seconds, sync, say

    def __call__(self, *args, **kwargs):
        self.sync()
        start = time.perf_counter()
        out = self.block(*args, **kwargs)
        self.sync()
        self.seconds.append(time.perf_counter() - start)
        if self.say:  # as it goes: a run cut short still shows where its time went
            self.say(f"block call {len(self.seconds)}: {self.seconds[-1]:.2f} s")
        return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--linear", choices=["bf16", "fp8"], default="fp8")
    parser.add_argument("--attention", choices=["sage", "sdpa"], default="sage")
    parser.add_argument("--compile-backend", default="inductor")
    parser.add_argument("--tiny", action="store_true", help="the built-in tiny CogVideoX on the CPU")
    parser.add_argument("--out", type=Path, default=Path("first-call"))
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args(argv)

    import torch
    import torch._dynamo
    from torch._dynamo.utils import compile_times, counters

    import sagevideo
    from sagevideo.experiments.bench.timing import synchronizer
    from sagevideo.jobs.recipe import Recipe
    from sagevideo.pipelines import forwards
    from sagevideo.pipelines.recipe import apply_recipe

    device = "cpu" if args.tiny else "cuda"

    def say(line: str) -> None:
        print(f"first_call: {line}", file=sys.stderr, flush=True)

    args.out.mkdir(parents=True, exist_ok=True)
    step = forwards.build_step("tiny-cogvideox" if args.tiny else "cogvideox-5b", device=device)
    del step.model.transformer_blocks[args.layers:]
    if args.attention == "sage":
        sagevideo.install(step.model)
    recipe = Recipe(compile="regional", linear=args.linear, compile_backend=args.compile_backend)
    start = time.perf_counter()
    applied = apply_recipe(step.model, recipe)
    apply_s = time.perf_counter() - start
    sync = synchronizer(device)
    first: list[float] = []
    # The transformer iterates self.transformer_blocks: a plain list of timers in the instance's
    # __dict__ shadows the ModuleList, and the timers (not modules) stay outside the compiled code.
    compiled_blocks = list(step.model._modules.pop("transformer_blocks"))
    step.model.__dict__["transformer_blocks"] = [TimedBlock(block, first, sync, say) for block in compiled_blocks]

    profile = cProfile.Profile()
    with torch.no_grad():
        sync()
        start = time.perf_counter()
        profile.enable()
        step.run()
        sync()
        profile.disable()
        first_s = time.perf_counter() - start
        block_first = list(first)
        first.clear()
        start = time.perf_counter()
        step.run()
        sync()
        second_s = time.perf_counter() - start
    profile.dump_stats(str(args.out / "first_call.prof"))
    text = io.StringIO()
    stats = pstats.Stats(profile, stream=text).strip_dirs()
    stats.sort_stats("cumulative").print_stats(args.top)
    stats.sort_stats("tottime").print_stats(args.top)
    (args.out / "first_call_profile.txt").write_text(text.getvalue())
    report = dict(layers=args.layers, linear=args.linear, attention=args.attention, apply_s=apply_s,
                  fp8_layers=len(applied.fp8_layers), first_call_s=first_s, second_call_s=second_s,
                  block_first_call_s=block_first, block_second_call_s=list(first),
                  dynamo_stats=dict(counters["stats"]), recompiles=dict(counters["recompiles"]),
                  graph_breaks=dict(counters["graph_break"]), compile_cache_lookups=applied.compile_cache_lookups(),
                  compile_times=compile_times(repr="csv"))
    (args.out / "first_call.json").write_text(json.dumps(report, indent=1, default=str))
    print(text.getvalue()[:6000])
    print(compile_times(repr="str")[:3000])
    print("blocks' first call s: " + " ".join(f"{s:.2f}" for s in block_first))
    print(f"first_call: {args.layers} blocks, linear {args.linear}, attention {args.attention}: first call "
          f"{first_s:.1f} s, second {second_s * 1e3:.0f} ms, graphs {counters['stats'].get('unique_graphs')}, "
          f"apply {apply_s:.1f} s, compile cache {report['compile_cache_lookups']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
