#!/usr/bin/env python
"""On a machine with 2+ GPUs: sequence-parallel generation on 2 GPUs (NCCL) against 1 GPU.

Three runs of the same small batch on the tiny model, at a size that gives the kernels real work:
1. one GPU, this process (`sagevideo.generate`): the reference;
2. `torchrun --nproc-per-node 2 -m sagevideo.generation.torchrun` (NCCL; here through this script,
   which saves raw frames first);
3. two processes started as Ray starts rank actors, each seeing only its own GPU
   (CUDA_VISIBLE_DEVICES=0 / =1), then rearranged by `sagevideo.scheduling.group.torchrun_env`
   before CUDA starts: checks the variables the Ray path sets, without Ray.
Videos are saved as raw frames (.npy bytes under the staged .mp4 names), since the GPU image has
no ffmpeg; the frames of 2 and 3 are compared with 1 and the timings printed.

    python3 tools/gpu_sp_check.py --out /tmp/spcheck
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
JOBS = (
    "defaults: {{steps: 4, frames: {frames}, resolution: {size}x{size}}}\n"
    "jobs:\n  - prompt: a cat\n  - prompt: a dog\n"
)


def save_frames_instead_of_mp4() -> None:
    import numpy as np

    import sagevideo.outputs.video as video

    def write(frames, path, *, fps=8, quality=8.0):
        with open(path, "wb") as f:
            np.save(f, np.asarray(frames))
        return Path(path)

    video.write_mp4 = write


def rank_main(argv: list[str]) -> int:
    """One rank (under torchrun, or started by `ray_style`)."""
    save_frames_instead_of_mp4()
    from sagevideo.generation.torchrun import main as torchrun_main

    return torchrun_main(argv)


def ray_style(jobs: Path, out: Path, device: str) -> None:
    from sagevideo.scheduling.group import free_port, torchrun_env

    places = [{"rank": 0, "ip": "127.0.0.1", "gpus": ["0"], "port": free_port("127.0.0.1")},
              {"rank": 1, "ip": "127.0.0.1", "gpus": ["1"]}]
    procs = []
    for rank in range(2):
        code = (
            "import os, sys; from sagevideo.scheduling.group import torchrun_env; "
            f"os.environ.update(torchrun_env({rank}, {places!r})); "
            f"sys.path.insert(0, {str(ROOT / 'tools')!r}); import gpu_sp_check; "
            f"sys.exit(gpu_sp_check.rank_main([{str(jobs)!r}, '--out', {str(out)!r}, '--device', {device!r}, "
            "'--no-progress']))"
        )
        env = dict(os.environ, CUDA_VISIBLE_DEVICES=str(rank))  # as Ray shows an actor its GPU
        procs.append(subprocess.Popen([sys.executable, "-c", code], env=env))
    assert [p.wait(timeout=600) for p in procs] == [0, 0]
    assert torchrun_env(1, places)["CUDA_VISIBLE_DEVICES"] == "0,1"


def compare(name: str, out: Path, ref: Path) -> None:
    import numpy as np

    lines = (out / "manifest.jsonl").read_text().splitlines()
    records = {json.loads(line)["job_id"]: json.loads(line) for line in lines}
    for line in (ref / "manifest.jsonl").read_text().splitlines():
        want = json.loads(line)
        got = records[want["job_id"]]
        a = np.load(out / got["outputs"][0]).astype(np.int16)
        b = np.load(ref / want["outputs"][0]).astype(np.int16)
        diff = np.abs(a - b)
        print(f"{name}: {want['prompt']!r}: frames {a.shape}, |diff| max {diff.max()} mean {diff.mean():.3f}; "
              f"denoise {got['timings']['denoise_s']} s vs {want['timings']['denoise_s']} s; "
              f"attention {got['backends']['counts']} vs {want['backends']['counts']}; worker {got['worker']}")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--device", default="cuda", help="cpu: a quick rehearsal of the same runs over gloo")
    parser.add_argument("--size", type=int, default=256, help="width and height in px")
    parser.add_argument("--frames", type=int, default=25)
    parser.add_argument("--runs", default="raystyle,one,torchrun", help="which runs, in this order")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    jobs = args.out / "jobs.yaml"
    jobs.write_text(JOBS.format(frames=args.frames, size=args.size))

    save_frames_instead_of_mp4()
    done: list[str] = []
    for run in args.runs.split(","):  # the Ray-style run first: with little GPU time left, it is the one to see
        if run == "raystyle":
            ray_style(jobs, args.out / "raystyle", args.device)
        elif run == "one":
            import sagevideo

            # workers=1: this process (with 2 visible GPUs and Ray installed, generate would use Ray
            # workers, where the frame-saving patch above does not apply).
            sagevideo.generate(jobs, out=args.out / "one", device=args.device, workers=1, progress=False)
        elif run == "torchrun":
            torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                        __file__, "--rank", str(jobs), "--out", str(args.out / "torchrun"), "--device", args.device,
                        "--no-progress"]
            subprocess.run(torchrun, check=True, timeout=600)
        print(f"gpu_sp_check: {run} finished", flush=True)
        done.append(run)
        if "one" in done:  # compare as soon as both sides exist
            for name in [run] if run != "one" else [d for d in done if d != "one"]:
                compare(name, args.out / name, args.out / "one")
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--rank":
        sys.exit(rank_main(sys.argv[2:]))
    sys.exit(main())
