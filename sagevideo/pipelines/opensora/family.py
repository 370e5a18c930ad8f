"""The Open-Sora 2.0 family (sagevideo's `OpenSoraPipeline`), registered in `sagevideo.pipelines.families`.

What is here: attention routes (`OpenSoraAttnProcessor` -> `SageOpenSoraAttnProcessor`, used by
`install` on any Open-Sora transformer), the job constraints of the official sampler (height and
width multiples of 16: VAE 8x times patch 2; frames 1 + 4k: the VAE compresses time 4x with the
first frame on its own), the Ulysses hooks (`sequence_parallel.shard_opensora`: text replicated
on every rank, image tokens split) and their degree rule.

What is not, yet (issue 20: every family through the product): a folder layout and its
`folder_source`/`load` (and with them `attention_layers` from the transformer config and the T5
prompt length of 512 tokens), a built-in tiny model, and the `denoise`/`decode` calls of
`run_job` (the pipeline has no per-step callback). Until then `generate`, `ab` and `calibrate`
refuse Open-Sora folders and say so.
"""

from __future__ import annotations

from typing import Any

from sagevideo.jobs.specs import JobSpec
from sagevideo.pipelines.families import ModelFamily, size_problems
from sagevideo.pipelines.loading import ModelSource


class OpenSoraFamily(ModelFamily):
    name = "opensora"
    title = "Open-Sora 2.0"
    pipeline_classes = ("OpenSoraPipeline",)
    weight_components = ("transformer", "vae", "text_encoder", "text_encoder_2")
    generates = False  # issue 20
    sequence_parallel = True

    def job_problems(self, source: ModelSource, job: JobSpec) -> list[str]:
        problems = size_problems(source, job)
        if (job.frames - 1) % source.temporal:
            near = (job.frames - 1) // source.temporal * source.temporal + 1
            problems.append(
                f"frames: {job.frames} is not 1 + a multiple of {source.temporal} (the VAE compresses time "
                f"{source.temporal}x after the first frame); use e.g. {near} or {near + source.temporal}"
            )
        return problems

    def processor_routes(self) -> dict[type, Any]:
        from sagevideo.pipelines.opensora.attention import OpenSoraAttnProcessor, SageOpenSoraAttnProcessor

        return {OpenSoraAttnProcessor: SageOpenSoraAttnProcessor}

    def shard(self, pipe_or_transformer: Any, *, group: Any = None, plan: Any = None, pv: str | None = None,
              backend: str = "auto") -> Any:
        from sagevideo.pipelines.opensora.sequence_parallel import shard_opensora

        return shard_opensora(pipe_or_transformer, group=group, plan=plan, pv=pv, backend=backend)

    def degree_problem(self, source: ModelSource, job: JobSpec, degree: int) -> str | None:
        # Text is replicated on every rank; the packed image tokens are split (`shard_opensora`).
        latent_frames = (job.frames - 1) // source.temporal + 1
        size = source.spatial * source.patch
        image = latent_frames * (job.height // size) * (job.width // size)
        if image % degree:
            return f"{image} image tokens are not divisible by {degree}; change frames/size or the degree"
        return None


FAMILY = OpenSoraFamily()
