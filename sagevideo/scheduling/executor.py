"""Where a batch runs: this process, or Ray workers, chosen from the options and the machine.

`choose_executor(address, workers, device, gpus_per_job)` says whether the batch runs on Ray and
what to tell the user about it, and refuses (InputError) what cannot run here: a bad address,
more GPUs per job than this machine shows, Ray asked for but not installed.
"""

from __future__ import annotations

from sagevideo.errors import InputError
from sagevideo.scheduling import address_problem, ray_installed

__all__ = ["choose_executor"]


def choose_executor(
    address: str | None, workers: int | None, device: str, gpus_per_job: int = 1
) -> tuple[bool, list[str]]:
    """(run on Ray?, notes). Ray when an address is given, more than one worker is asked for,
    jobs span several GPUs (gpus_per_job > 1: one process per rank), or (workers unset) more than
    one GPU is visible; Ray is then checked to be installed. (Values are checked by GenerateConfig.)"""
    if address is not None:
        problem = address_problem(address)
        if problem:
            raise InputError(problem)
    gpus = 0
    if device == "cuda":
        import torch

        gpus = torch.cuda.device_count()
        if gpus_per_job > gpus and address is None:
            raise InputError(
                f"--gpus-per-job {gpus_per_job}: this machine shows {gpus} GPU(s); give at most {gpus}, "
                "or --address of a Ray cluster with a node that has enough"
            )
    asked = address is not None or (workers or 1) > 1 or gpus_per_job > 1
    if not asked and not (workers is None and gpus > 1):
        return False, []
    if not ray_installed():
        if gpus_per_job > 1:
            raise InputError(
                f"--gpus-per-job {gpus_per_job} starts one process per rank through Ray, which is not "
                "installed; pip install 'sagevideo[ray]', or run `torchrun --nproc-per-node N -m "
                "sagevideo.generation.torchrun ...` (the same options as generate)"
            )
        if asked:
            why = f"--address {address}" if address is not None else f"--workers {workers}"
            raise InputError(
                f"{why} needs Ray, which is not installed; pip install 'sagevideo[ray]', or leave it out "
                "to run in this process"
            )
        return False, [
            f"{gpus} GPUs are visible but Ray is not installed: running on one GPU in this process "
            "(pip install 'sagevideo[ray]' to use them all)"
        ]
    where_to = {None: "a local Ray instance", "auto": "the running Ray cluster (or a local instance)"}
    notes = [f"scheduling: Ray, on {where_to.get(address, f'the Ray cluster at {address}')}"]
    if gpus_per_job > 1:
        unit = "GPU" if device == "cuda" else "CPU process"
        notes.append(
            f"sequence parallelism: each job on {gpus_per_job} ranks (one {unit} each, one node per group); "
            "rank 0 decodes and writes"
        )
    return True, notes
