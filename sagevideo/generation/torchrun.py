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

Its options are `generate`'s, read from `GenerateConfig`'s fields and their command-line spelling
(`sagevideo.jobs.config.COMMAND_LINE`): the job file, prompts, sizes, attention, plan, image,
negative prompt, recipe... but those the ranks decide (`TORCHRUN_LEAVES_OUT`: the world size is
torchrun's --nproc-per-node, there is no Ray and no retry; a per-job time limit would stop one rank
while the others wait for it in a collective) and the Python-only ones.

Exit status (rank 0): the project's (`sagevideo.errors.exit_code_for`): 0 every job done, 1 a job
or the model load failed, 2 bad input, 130/143/129 interrupted. The other ranks exit 0 unless they
fail themselves.
"""

from __future__ import annotations

import argparse
import os
import sys
import typing
from typing import Any, Literal

from sagevideo.jobs.config import API_ONLY, COMMAND_LINE, GenerateConfig, option_panel, option_type, options_in_order

PROG = "sagevideo torchrun"
COMMAND = "torchrun --nproc-per-node N -m sagevideo.generation.torchrun"
# generate's options that do not apply to ranks started by torchrun (see the module docstring).
RANKS_DECIDE: tuple[str, ...] = ("address", "workers", "gpus_per_job", "max_attempts", "job_timeout")
TORCHRUN_LEAVES_OUT: tuple[str, ...] = (*API_ONLY, *RANKS_DECIDE)


def main(argv: list[str] | None = None) -> int:
    """Run the batch `argv` names on this rank; returns the exit status (see the module docstring)."""
    from sagevideo.errors import BatchInterrupted, InputError, ModelLoadError, exit_code_for
    from sagevideo.generation.generate import pending_jobs, plan_batch, run_batch
    from sagevideo.host.pipeline_host import worker_info
    from sagevideo.host.sharded import ShardedHost
    from sagevideo.jobs.problems import group_problems
    from sagevideo.parallel.launch import init_from_env, leave_group
    from sagevideo.pipelines.families import degree_problems
    from sagevideo.pipelines.recipe import recipe_problems

    try:
        config = parse_config(argv)
    except SystemExit as stop:  # argparse printed the help (0) or what is wrong (2)
        return stop.code if isinstance(stop.code, int) else 2
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    say = (lambda line: print(line, file=sys.stderr)) if rank == 0 else (lambda line: None)
    try:
        plan = plan_batch(config)
        problems = degree_problems(plan.source, [(pj.job, pj.label) for pj in plan.jobs], world)
        # A job file's recipe: is the batch's here too; planned for one rank, it is checked for WORLD_SIZE
        # (a step cache would let each rank decide on its own shard).
        problems += recipe_problems(plan.settings.recipe, plan.source, plan.device, plan.dtype, world)
        if problems:
            raise InputError(group_problems(problems))
    except InputError as err:  # every rank finds the same problem, so every rank stops here
        for line in str(err).splitlines():
            say(f"{PROG}: error: {line}")
        return err.exit_code
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

        report = run_batch(plan, progress=config.progress, echo=say, execute=here)
    except BatchInterrupted as stop:
        print(stop.report.summary_line())
        return stop.exit_code
    except BaseException as err:  # a user-facing one exits with its code and one line; a bug shows as one
        code = exit_code_for(err)
        if code is None:
            raise
        if isinstance(err, ModelLoadError):
            print(f"{PROG}: rank {rank}: {err}", file=sys.stderr)
        elif not isinstance(err, KeyboardInterrupt):  # e.g. rank 0: --out in use by another run
            print(f"{PROG}: error: {err}", file=sys.stderr)
        return code
    finally:
        leave_group()
    print(report.summary_line())
    return 0 if report.ok else 1


def parse_config(argv: list[str] | None) -> GenerateConfig:
    """The `GenerateConfig` of torchrun's command line (`command_line`); one worker, this process.
    Bad values are kept in the config's problems (`GenerateConfig.build`), as generate keeps them."""
    given = vars(command_line().parse_args(argv))
    return GenerateConfig.build(**given, workers=1)


def command_line() -> argparse.ArgumentParser:
    """The launcher's parser: generate's options (one per `GenerateConfig` field, spelt as
    `sagevideo generate` spells them, in its order and help panels) but `TORCHRUN_LEAVES_OUT`."""
    parser = argparse.ArgumentParser(
        prog=COMMAND,
        description="Generate videos with each job split over the torchrun ranks (Ulysses sequence parallelism); "
        "the options are `sagevideo generate`'s.",
        epilog="Not here: " + ", ".join("--" + name.replace("_", "-") for name in RANKS_DECIDE)
        + " (torchrun starts the ranks: --nproc-per-node is the degree).",
    )
    panels: dict[str | None, Any] = {None: parser}
    for name, field in options_in_order(GenerateConfig):
        if name not in TORCHRUN_LEAVES_OUT:
            panel = option_panel(GenerateConfig, name)
            if panel not in panels:
                panels[panel] = parser.add_argument_group(panel)
            _add_option(panels[panel], name, field, COMMAND_LINE.get(name, {}))
    return parser


def _add_option(parser: Any, name: str, field: Any, spelling: dict[str, Any]) -> None:
    """One argparse argument for a GenerateConfig field, spelt as `sagevideo generate` spells it
    (`COMMAND_LINE`: flags, a positional argument, the type parsed). A value not given is left out
    (the config's default applies)."""
    kind = option_type(spelling.get("type") or field.annotation)
    described: dict[str, Any] = {"help": (field.description or "").replace("%", "%%"), "default": argparse.SUPPRESS}
    if spelling.get("argument"):
        # argparse gives an optional positional's SUPPRESS default as a value: None (the field's default) here
        parser.add_argument(name, nargs="?", type=kind, **{**described, "default": field.default})
        return
    flags = [flag.split("/")[0] for flag in spelling.get("flags") or (f"--{name.replace('_', '-')}",)]
    described["metavar"] = flags[0].lstrip("-").replace("-", "_").upper()
    if kind is bool:  # --progress/--no-progress
        del described["metavar"]
        parser.add_argument(flags[0], dest=name, action=argparse.BooleanOptionalAction, **described)
        return
    repeated = typing.get_origin(kind) is list
    item = typing.get_args(kind)[0] if repeated else kind
    choices = typing.get_args(item) if typing.get_origin(item) is Literal else None
    convert = str if choices else item
    if choices:  # argparse shows the choices in place of a metavar
        del described["metavar"]
    if repeated and convert is int:  # --linear-bf16-steps 0 -1: several values after one flag
        parser.add_argument(*flags, dest=name, action="extend", nargs="+", type=int, **described)
    elif repeated:  # --prompt a --prompt b
        parser.add_argument(*flags, dest=name, action="append", type=convert, choices=choices, **described)
    else:
        parser.add_argument(*flags, dest=name, type=convert, choices=choices, required=field.is_required(),
                            **described)


if __name__ == "__main__":
    sys.exit(main())
