"""One job over several processes under plain torchrun (no Ray): Ulysses sequence parallelism.

    torchrun --nproc-per-node 2 -m sagevideo.generation.torchrun --model tiny --prompt "a red panda" --out /tmp/sp
    torchrun --nproc-per-node 2 -m sagevideo.generation.torchrun shots.yaml --model /models/CogVideoX-5b --out renders

The same pieces as `sagevideo generate --gpus-per-job N` on Ray: `plan_batch` (every input
checked, and the degree WORLD_SIZE checked against every job, before anything loads),
`init_from_env` (torchrun sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT), one
`ShardedHost` per rank (the pipeline loaded once, the family's Ulysses hooks with sagevideo
attention). Every rank runs every pending job with the same seed; rank 0 alone decodes and
writes, through `run_batch` (staged outputs committed, manifest.jsonl, resume on re-run,
progress, summary). The other ranks run the same jobs in the same order and write nothing. A
rank that dies takes the run with it (torchrun stops the others); re-running resumes. Ray's
scheduler restarts groups by itself.

Exit status (rank 0): 0 every job done, 1 a job or the model load failed, 2 bad input, 130
interrupted. The other ranks exit 0 unless they fail themselves.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

PROG = "sagevideo torchrun"
COMMAND = "torchrun --nproc-per-node N -m sagevideo.generation.torchrun"


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    from sagevideo.generation.generate import BatchInterrupted, pending_jobs, plan_batch, run_batch
    from sagevideo.host.pipeline_host import ModelLoadError, worker_info
    from sagevideo.host.sharded import ShardedHost
    from sagevideo.jobs.specs import InputError, group_problems
    from sagevideo.parallel.launch import init_from_env, leave_group
    from sagevideo.pipelines.families import degree_problems
    from sagevideo.pipelines.recipe import recipe_problems

    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    say = (lambda line: print(line, file=sys.stderr)) if rank == 0 else (lambda line: None)
    try:
        # workers=1: this process runs its rank's share, Ray is never asked for.
        plan = plan_batch(
            args.prompt or None, job_file=args.job_file, out=args.out, model=args.model, seed=args.seed,
            frames=args.frames, height=args.height, width=args.width, steps=args.steps, guidance=args.guidance,
            attention=args.attention, pv=args.pv, backend=args.backend, plan=args.plan, device=args.device,
            fps=args.fps, workers=1,
        )
        problems = degree_problems(plan.source, [(pj.job, pj.label) for pj in plan.jobs], world)
        # A job file's recipe: is the batch's here too; planned for one rank, it is checked for WORLD_SIZE
        # (a step cache would let each rank decide on its own shard).
        problems += recipe_problems(plan.settings.recipe, plan.source, plan.device, plan.dtype, world)
        if problems:
            raise InputError(group_problems(problems))
    except InputError as err:  # every rank finds the same problem, so every rank stops here
        for line in str(err).splitlines():
            say(f"{PROG}: error: {line}")
        return 2
    for note in plan.notes:
        say(f"{PROG}: {note}")

    rank, world = init_from_env("nccl" if plan.device == "cuda" else "gloo")
    say(f"{PROG}: {world} ranks; rank 0 decodes and writes to {plan.out}")
    try:
        worker = {**worker_info(), "rank": rank, "ranks": world}
        host = ShardedHost(plan.context(), rank=rank, world=world, worker=worker)
        # Before the first job on every rank: rank 0 commits nothing until all ranks ran that job,
        # so each rank reads the same manifest and gets the same list.
        todo = pending_jobs(plan)
        if rank != 0:
            for _, pj in todo:
                host.run_rank(pj)
            host.close()
            return 0

        def here(plan, todo, status):
            try:
                for index, pj in todo:
                    status(pj.output)
                    yield index, host.run(pj)
            finally:
                host.close()

        report = run_batch(plan, progress=not args.no_progress, echo=say, execute=here)
    except ModelLoadError as err:
        print(f"{PROG}: rank {rank}: {err}", file=sys.stderr)
        return 1
    except InputError as err:  # rank 0: --out is in use by another run (torchrun then stops the others)
        print(f"{PROG}: error: {err}", file=sys.stderr)
        return 2
    except BatchInterrupted as stop:
        print(stop.report.summary_line())
        return stop.exit_code
    finally:
        leave_group()
    print(report.summary_line())
    return 0 if report.ok else 1


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog=COMMAND,
        description="Generate videos with each job split over the torchrun ranks (Ulysses sequence parallelism).",
    )
    parser.add_argument("job_file", nargs="?", type=Path, help="YAML/TOML job file or a text file of prompts")
    parser.add_argument("--prompt", "-p", action="append", help="a prompt (repeatable)")
    parser.add_argument("--out", "-o", type=Path, required=True, help="output folder (rank 0 writes there)")
    parser.add_argument("--model", default="tiny", help="'tiny' or a local diffusers folder of a model family")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--frames", type=int)
    parser.add_argument("--height", type=int)
    parser.add_argument("--width", type=int)
    parser.add_argument("--steps", type=int)
    parser.add_argument("--guidance", type=float, help="guidance scale (default: the model's)")
    parser.add_argument("--attention", choices=("sage", "full"), default="sage")
    parser.add_argument("--pv", choices=("auto", "fp16", "fp8"), default="auto",
                        help="as `sagevideo generate --pv`: auto = FP8 on sm89+ GPUs, else FP16")
    parser.add_argument("--backend", choices=("auto", "triton", "reference", "sdpa"), default="auto")
    parser.add_argument("--plan", type=Path, help="attention-plan JSON for jobs that name none")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument("--fps", type=int, help="frame rate of the mp4 files (default: the model's)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(main())
