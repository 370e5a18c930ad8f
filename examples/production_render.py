#!/usr/bin/env python
"""Production render: a YAML shot list -> videos, on a Ray cluster or this machine, then a summary.

A studio's starting point. One call (`sagevideo.generate`) renders every shot of the list; jobs
go to Ray workers (one per GPU) when --address is given or several GPUs are visible. Re-running
the same command resumes: finished shots are skipped, failed or missing ones are rendered again.

    # the whole list on the cluster this machine belongs to
    python examples/production_render.py examples/shots.yaml \\
        --model /models/CogVideoX-5b --out renders/ep01 --address auto

    # a quick look at the list on any machine: built-in tiny model, every shot small and short,
    # into /tmp/ep01/preview/
    python examples/production_render.py examples/shots.yaml --model tiny --out /tmp/ep01 --preview

With several machines, --out must be a folder every node mounts at the same path. Exit status:
0 every shot done, 1 a shot failed, 2 bad input (nothing was loaded), 130 interrupted.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

# Preview: every shot at the tiny model's size and length, so the list renders in seconds.
PREVIEW = {"resolution": "64x64", "frames": 9, "steps": 2}


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    import sagevideo
    from sagevideo.errors import EXIT_FAILED, BatchInterrupted, BatchStopped, InputError, ModelLoadError

    shots: Path | list = args.shots
    out = args.out
    try:
        recipe = {}
        if args.preview:
            shots, recipe = _preview_jobs(args.shots, args.model, args.out)
            out = args.out / "preview"
        records = sagevideo.generate(
            shots,
            model=args.model,
            out=out,
            **recipe,
            address=args.address,
            workers=args.workers,
            max_attempts=args.max_attempts,
            progress=not args.no_progress,
        )
    except InputError as err:
        print(f"production_render: {args.shots}: error:\n{err}", file=sys.stderr)
        return err.exit_code
    except ModelLoadError as err:
        print(f"production_render: {err}", file=sys.stderr)
        return err.exit_code
    except BatchInterrupted as stop:
        print(stop.report.summary_line())
        return stop.exit_code
    except BatchStopped as stop:  # a full disk: what finished is kept
        print(stop.report.summary_line())
        return stop.exit_code
    print(_table(records, out))
    failed = [r for r in records if not r.done]
    print(f"production_render: {len(records) - len(failed)}/{len(records)} shots done in {out}")
    return EXIT_FAILED if failed else 0


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("shots", type=Path, help="YAML (or TOML) shot list; see examples/shots.yaml")
    parser.add_argument("--model", required=True, help="local diffusers folder, or 'tiny'")
    parser.add_argument("--out", type=Path, required=True, help="output folder (shared storage on a cluster)")
    parser.add_argument("--address", help="Ray cluster: auto or HOST:PORT (default: this machine)")
    parser.add_argument("--workers", type=int, help="Ray workers (default: one per GPU)")
    parser.add_argument("--max-attempts", type=int, default=3, help="runs of a shot whose worker died")
    parser.add_argument("--preview", action="store_true",
                        help=f"render every shot small and short ({PREVIEW}) into OUT/preview/")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser.parse_args(argv)


def _preview_jobs(path: Path, model: str, out: Path) -> tuple[list[dict], dict]:
    """The shot list with PREVIEW over each shot, checked first as written, for this model (errors
    name lines; InputError lists them all), and the list's `recipe:` settings: a preview runs the
    recipe the render will."""
    from sagevideo.generation.generate import GenerateConfig, plan_batch
    from sagevideo.jobs.files import read_job_file
    from sagevideo.jobs.specs import merge_fields

    plan_batch(GenerateConfig.build(job_file=path, model=model, out=out))
    shots = read_job_file(path)
    recipe = dict(shots.recipe.fields) if shots.recipe is not None else {}
    return [merge_fields(fields, PREVIEW) for fields, _ in shots.items], recipe


def _table(records: list, out: Path) -> str:
    """One line per shot (`ManifestRecord`s): status, output, seconds of denoising + decoding,
    attempts, where, error."""
    lines = [f"{'status':8} {'output':36} {'seconds':>8} {'tries':>5}  where"]
    for r in records:
        timings = r.timings or {}
        seconds = sum(timings.get(k) or 0.0 for k in ("denoise_s", "decode_s"))
        worker = r.worker or {}
        output = (r.outputs or [(r.prompt or "")[:30]])[0]
        where = f"{worker.get('host', '?')}:{worker.get('pid', '?')}"
        line = f"{r.status or '?':8} {output:36} {seconds:8.1f} {r.attempts:5}  {where}"
        if r.error:
            line += f"  {r.error}"
        lines.append(line)
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
