#!/usr/bin/env python
"""Where a fresh worker's start-up goes before its first step (issue 21: a second worker with a
warm compile cache should reach its first step within 30 s).

Each part runs in a new Python process (nothing imported or cached in memory from an earlier
part; the OS page cache stays warm, as on a machine that already ran a worker), --repeats times,
and reports the median of the seconds the process measured itself around the part:

- interpreter: the whole process `python -c pass` (wall clock, from this side);
- import torch;
- device context: torch imported, the first tensor on the device (CUDA context creation);
- sagevideo: what `sagevideo generate` imports before it loads a model (the CLI and the batch
  planning modules), torch already imported;
- diffusers pipeline: `from diffusers import CogVideoXPipeline` (diffusers imports its model and
  pipeline packages whole; transformers for T5), torch already imported;
- load, to CPU then moved: `from_pretrained(folder)` then `.to(device)`, as sagevideo's
  families load (imports and device context done first, not counted);
- load, placed directly: `from_pretrained(folder, device_map=device)` (the weights read straight
  onto the device), same.

    python -m bench.bench_startup --model /tmp/bench-video/model --json startup.json   # GPU
    python -m bench.bench_startup --tiny                                                # CPU smoke test
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if not __package__:  # run as a file: `bench` from the repo root, as with -m
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.results import add_results_option, start_run  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
# What the generate command imports before `PipelineHost` loads the model.
SAGEVIDEO_IMPORTS = ("sagevideo.cli.app", "sagevideo.generation.generate", "sagevideo.generation.run",
                     "sagevideo.host.pipeline_host", "sagevideo.attention.backends", "sagevideo.pipelines.install")
_TIMED = """
import sys, time
{setup}
start = time.perf_counter()
{part}
{sync}
print("SECONDS", time.perf_counter() - start)
"""


def parts(folder: Path, device: str) -> dict[str, tuple[str, str]]:
    """name -> (setup code, timed code) of each in-process part."""
    context = f"torch.zeros(1, device={device!r})"  # the first tensor there creates the device context
    load_setup = f"import torch; from diffusers import CogVideoXPipeline; {context}"
    sagevideo = "; ".join(f"import {name}" for name in SAGEVIDEO_IMPORTS)
    return {
        "import torch": ("", "import torch"),
        "device context": ("import torch", context),
        "sagevideo imports": ("import torch", sagevideo),
        "diffusers pipeline import": ("import torch", "from diffusers import CogVideoXPipeline"),
        "load, to CPU then moved": (load_setup, f"pipe = CogVideoXPipeline.from_pretrained({str(folder)!r}, "
                                                f"torch_dtype=torch.bfloat16).to({device!r})"),
        "load, placed directly": (load_setup, f"pipe = CogVideoXPipeline.from_pretrained({str(folder)!r}, "
                                              f"torch_dtype=torch.bfloat16, device_map={device!r})"),
    }


def run_part(setup: str, part: str, device: str) -> float:
    """Seconds the part took inside a new process."""
    sync = "torch.cuda.synchronize()" if device == "cuda" else ""
    code = _TIMED.format(setup=setup, part=part, sync=sync if "torch" in setup + part else "")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0:
        raise SystemExit(f"bench_startup: {part[:60]!r} failed ({done.returncode}): {done.stderr[-1500:]}")
    (line,) = [x for x in done.stdout.splitlines() if x.startswith("SECONDS ")]
    return float(line.split()[1])


def interpreter_s() -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", "pass"], check=True)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, help="a CogVideoX folder (bench_video writes one under --work)")
    parser.add_argument("--tiny", action="store_true", help="the built-in tiny model, saved to a temp folder, CPU")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path)
    add_results_option(parser)
    args = parser.parse_args(argv)
    if args.tiny == (args.model is not None):
        parser.error("give --model FOLDER or --tiny")
    import torch

    device = "cuda" if torch.cuda.is_available() and not args.tiny else "cpu"
    folder = args.model
    if args.tiny:
        from sagevideo.pipelines.cogvideox.tiny import tiny_pipeline

        folder = Path(tempfile.mkdtemp(prefix="bench_startup_")) / "model"
        tiny_pipeline().save_pretrained(folder, safe_serialization=True)
    if not (folder / "model_index.json").is_file():
        parser.error(f"--model {folder}: no model_index.json there; give a diffusers CogVideoX folder")
    seconds = {"interpreter": [interpreter_s() for _ in range(args.repeats)]}
    for name, (setup, part) in parts(folder, device).items():
        seconds[name] = [run_part(setup, part, device) for _ in range(args.repeats)]
        print(f"bench_startup: {name}: {statistics.median(seconds[name]):.2f} s", flush=True)
    gpu = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    report = {"model": str(folder), "device": gpu, "repeats": args.repeats,
              "median_s": {k: statistics.median(v) for k, v in seconds.items()}, "seconds": seconds}
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    if args.append_results:
        run = start_run("bench_startup", gpu, argv)
        shape = "cogvideox-tiny" if args.tiny else "cogvideox-5b"
        for name, value in report["median_s"].items():
            run.add(shape, name.replace(" ", "-").replace(",", ""), "s", value, unit="s")
        print(f"bench_startup: {run.append(args.append_results)} rows appended to {args.append_results}")
    width = max(map(len, seconds))
    print(f"start-up parts on {gpu}, median of {args.repeats} fresh processes each:")
    for name, value in report["median_s"].items():
        print(f"  {name:{width}s} {value:7.2f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
