"""The CogVideoX family (diffusers `CogVideoXPipeline`): what generate, ab, calibrate and
`--gpus-per-job` need to know of it. Registered in `sagevideo.pipelines.families`. Its
image-to-video pipeline (`CogVideoXImageToVideoPipeline`: CogVideoX-5B-I2V, CogVideoX1.5-5B-I2V) is
the same family with an input image per job: the transformer is the same class (only its input
channels, the image latents concatenated to the noisy ones, and its `ofs` embedding differ), so
folders, constraints, attention routes and sequence parallelism are shared. Its jobs must give an
`image:`, checked before loading; where the job runs the image reaches `denoise` as a PIL image at
the job's size (`ModelFamily.prepare_image`), which the pipeline encodes as the first frame.

- models: the built-in "tiny" (`cogvideox.tiny`) and local `CogVideoXPipeline` folders;
- job constraints: height and width multiples of VAE x patch (16), frames 1 + 8k (the VAE
  compresses time 4x and decodes latent frames in pairs), prompts padded to the transformer's
  `max_text_seq_length` (226 tokens); a transformer with learned positional embeddings
  (CogVideoX-5B-I2V) makes its sample size only (720x480);
- loading: a `CogVideoXDPMScheduler` (CogVideoX-5B's) becomes `noise_first.NoiseFirstDPMScheduler`,
  the same steps with their CPU noise drawn while the device still runs the forward;
- attention: `CogVideoXAttnProcessor2_0` -> `SageCogVideoXAttnProcessor`, one `attn1` per block;
  block-sparse: every `attn1` ([text; video], text first), the grid of the latents (B, F, C, H, W)
  after the patch (and the temporal patch of CogVideoX 1.5);
- sequence parallelism: `sequence_parallel.shard_cogvideox` (the [text; video] sequence cut into
  equal shards), degrees that divide the heads and text + video tokens.
Nothing here imports torch or diffusers at import time.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from sagevideo.jobs.specs import JobSpec
from sagevideo.pipelines.families import (
    TEXT_FIRST,
    ModelFamily,
    SparseLayout,
    forward_input,
    is_exactly,
    latent_call_options,
    size_problems,
    ulysses_degree_problem,
)
from sagevideo.pipelines.loading import (
    ModelSource,
    fingerprint,
    folder_fingerprint,
    quiet_from_pretrained,
    read_json,
)

SEQUENCE_PARALLEL_TRANSFORMERS = ("CogVideoXTransformer3DModel",)


def transformer_config(source: ModelSource) -> SimpleNamespace:
    """What the degree check needs of the transformer's config (heads, patch sizes, class), read
    from JSON only: tiny's built-in config, or the folder's transformer/config.json."""
    if source.is_tiny:
        from sagevideo.pipelines.cogvideox.tiny import MODELS

        cfg = {"_class_name": "CogVideoXTransformer3DModel", **MODELS[source.name][1]}
    else:
        # resolve_model already read this file, so it exists and is a JSON object.
        cfg = json.loads((source.path / "transformer" / "config.json").read_text(encoding="utf-8"))
    return SimpleNamespace(
        class_name=cfg.get("_class_name"),
        num_attention_heads=source.heads,
        patch_size=source.patch,
        patch_size_t=cfg.get("patch_size_t"),
        max_text_seq_length=cfg.get("max_text_seq_length", 226),  # the prompt length the runner pads to
        learned_positions=bool(cfg.get("use_learned_positional_embeddings", False)),
        sample_height=cfg.get("sample_height", 60),
        sample_width=cfg.get("sample_width", 90),
    )


class CogVideoXFamily(ModelFamily):
    name = "cogvideox"
    title = "CogVideoX"
    pipeline_classes = ("CogVideoXPipeline", "CogVideoXImageToVideoPipeline")
    image_pipeline_classes = ("CogVideoXImageToVideoPipeline",)
    tiny_models = ("tiny", "tiny-cogvideox-i2v")
    weight_components = ("transformer", "vae", "text_encoder")
    generates = True
    sequence_parallel = True

    # --- detection and loading ---

    def tiny_source(self, name: str) -> ModelSource:
        from sagevideo.pipelines.cogvideox import tiny

        pipeline_class, cfg = tiny.MODELS[name]
        vae = tiny.VAE_CONFIG
        return ModelSource(
            name=name,
            path=None,
            fingerprint=fingerprint(
                [cfg, vae, tiny.T5_CONFIG, tiny.TINY_SEED, tiny.DEFAULT_HEIGHT, tiny.DEFAULT_FRAMES]
            ),
            pipeline_class=pipeline_class,
            heads=cfg["num_attention_heads"],
            head_dim=cfg["attention_head_dim"],
            spatial=2 ** (len(vae["block_out_channels"]) - 1),
            temporal=vae["temporal_compression_ratio"],
            patch=cfg["patch_size"],
            text_tokens=cfg["max_text_seq_length"],
            default_height=tiny.DEFAULT_HEIGHT,
            default_width=tiny.DEFAULT_WIDTH,
            default_frames=tiny.DEFAULT_FRAMES,
            default_steps=2,
            layers=cfg["num_layers"],
            vae_channels=vae["block_out_channels"][0],
            family=self.name,
        )

    def folder_source(self, path: Path, index: dict[str, Any], model: str) -> ModelSource:
        where = f"--model {model}"
        cfg = read_json(path / "transformer" / "config.json", where, "the transformer/ folder is incomplete")
        vae = read_json(path / "vae" / "config.json", where, "the vae/ folder is incomplete")
        spatial = 2 ** (len(vae.get("block_out_channels", (0,) * 4)) - 1)
        return ModelSource(
            name=str(path),
            path=path,
            fingerprint=folder_fingerprint(path),
            pipeline_class=index["_class_name"],
            heads=cfg.get("num_attention_heads", 30),
            head_dim=cfg.get("attention_head_dim", 64),
            spatial=spatial,
            temporal=vae.get("temporal_compression_ratio", 4),
            patch=cfg.get("patch_size", 2),
            text_tokens=cfg.get("max_text_seq_length", 226),
            default_height=cfg.get("sample_height", 60) * spatial,
            default_width=cfg.get("sample_width", 90) * spatial,
            default_frames=cfg.get("sample_frames", 49),
            default_steps=50,
            layers=cfg.get("num_layers", 30),
            vae_channels=(vae.get("block_out_channels") or (128,))[0],
            family=self.name,
        )

    def load(self, source: ModelSource, device: str, dtype: Any) -> Any:
        import torch

        if source.is_tiny:
            from sagevideo.pipelines.cogvideox.tiny import tiny_pipeline

            pipe = tiny_pipeline(name=source.name)
            for module in (pipe.transformer, pipe.vae, pipe.text_encoder):
                # torch's own `to`: diffusers' ModelMixin.to warns about fp32 modules on every dtype
                # cast, even with none to keep (diffusers 0.42); the tiny models have none.
                torch.nn.Module.to(module, device=device, dtype=dtype)
        else:
            import diffusers

            pipeline_class = getattr(diffusers, source.pipeline_class)  # one of this family's pipeline_classes
            with quiet_from_pretrained():
                pipe = pipeline_class.from_pretrained(
                    source.path, local_files_only=True, use_safetensors=True, torch_dtype=dtype
                )
            pipe.to(device)
        from sagevideo.pipelines.cogvideox.noise_first import use_noise_first

        use_noise_first(pipe)  # 5B's DPM scheduler: step noise drawn before the step waits for the device
        return pipe

    # --- job constraints ---

    def job_problems(self, source: ModelSource, job: JobSpec) -> list[str]:
        problems = size_problems(source, job)
        # Latent frames must be odd as well: CogVideoX's VAE decodes latent frames in pairs and turns
        # an even count L into temporal·L frames (5 frames -> 2 latent -> 8 decoded), not 1 + temporal·(L-1).
        temporal = source.temporal
        step = 2 * temporal
        if (job.frames - 1) % step:
            near = (job.frames - 1) // step * step + 1
            latent = (job.frames - 1) // temporal + 1
            why = (
                f"is not 1 + a multiple of {temporal} (the VAE compresses time {temporal}x)"
                if (job.frames - 1) % temporal
                else f"makes {latent} latent frames, and the VAE decodes an even number of latent frames into "
                f"{temporal * latent} frames, not {job.frames}"
            )
            problems.append(f"frames: {job.frames} {why}; use 1 + a multiple of {step}, e.g. {near} or {near + step}")
        config = transformer_config(source)
        if config.learned_positions:  # diffusers refuses any other size once the weights are loaded
            size = {"width": config.sample_width * source.spatial, "height": config.sample_height * source.spatial}
            for field, value in size.items():
                if getattr(job, field) != value:
                    problems.append(
                        f"{field}: {getattr(job, field)} px cannot be made by {source.name}: its transformer has "
                        f"learned positional embeddings for {size['width']}x{size['height']} only (as "
                        f"CogVideoX-5B-I2V); use resolution {size['width']}x{size['height']}"
                    )
        return problems

    def job_notes(self, source: ModelSource, job: JobSpec) -> list[str]:
        # The pipeline cuts prompts to max_text_seq_length silently (diffusers only logs the cut text).
        from sagevideo.pipelines.truncation import dropped_tokens_note

        notes = []
        for field in ("prompt", "negative_prompt"):
            note = dropped_tokens_note(field, getattr(job, field), lambda text: _count_tokens(source, text),
                                       source.text_tokens, f"T5 tokens, but {self.title} reads")
            if note:
                notes.append(note)
        return notes

    def attention_layers(self, source: ModelSource) -> list[str]:
        return [f"transformer_blocks.{i}.attn1" for i in range(source.layers)]

    # --- generation ---

    def denoise(self, pipe: Any, job: JobSpec, *, generator: Any, text_tokens: int, callback: Any,
                image: Any = None) -> Any:
        extra = {} if image is None else {"image": image}  # the image-to-video pipeline's first frame
        (latents,) = pipe(
            **extra,
            prompt=job.prompt,
            negative_prompt=job.negative_prompt or None,
            **latent_call_options(job, generator=generator, callback=callback, text_tokens=text_tokens),
        )
        return latents

    def decode(self, pipe: Any, job: JobSpec, latents: Any) -> Any:
        # CogVideoX 1.5 pads latent frames to a multiple of patch_size_t; the pipeline drops the
        # padding only when it decodes, so do the same here.
        patch_t = pipe.transformer.config.patch_size_t
        latent_frames = (job.frames - 1) // pipe.vae_scale_factor_temporal + 1
        if patch_t is not None and latent_frames % patch_t:
            latents = latents[:, patch_t - latent_frames % patch_t :]
        return pipe.decode_latents(latents)  # (1, 3, F, H, W) in [-1, 1], model dtype

    # --- attention routes ---

    def processor_routes(self) -> dict[type, Any]:
        from diffusers.models.attention_processor import CogVideoXAttnProcessor2_0

        from sagevideo.pipelines.cogvideox.processor import SageCogVideoXAttnProcessor

        return {CogVideoXAttnProcessor2_0: SageCogVideoXAttnProcessor}

    def sparse_layout(self, transformer: Any) -> SparseLayout | None:
        if not is_exactly(transformer, "diffusers", "CogVideoXTransformer3DModel"):
            return None
        return SparseLayout({key.removesuffix(".processor"): TEXT_FIRST for key in transformer.attn_processors},
                            _latent_grid)

    # --- sequence parallelism ---

    def shardable(self, source: ModelSource) -> str | None:
        config = transformer_config(source)
        if source.pipeline_class in self.pipeline_classes and config.class_name in SEQUENCE_PARALLEL_TRANSFORMERS:
            return None
        return f"{source.pipeline_class} with a {config.class_name}"

    def shard(self, pipe_or_transformer: Any, *, group: Any = None, plan: Any = None, pv: str | None = None,
              backend: str = "auto") -> Any:
        from sagevideo.pipelines.cogvideox.sequence_parallel import shard_cogvideox

        return shard_cogvideox(pipe_or_transformer, group=group, plan=plan, pv=pv, backend=backend)

    def degree_problem(self, source: ModelSource, job: JobSpec, degree: int) -> str | None:
        from sagevideo.pipelines.cogvideox.sequence_parallel import check_cogvideox_degree

        return ulysses_degree_problem(check_cogvideox_degree, transformer_config(source), source, job, degree)


def _count_tokens(source: ModelSource, text: str) -> int | None:
    """T5 tokens of `text` with </s>, as the pipeline's tokenizer makes them (None: it does not load)."""
    tokenizer = _tokenizer(source.name if source.is_tiny else str(source.path), source.fingerprint)
    return None if tokenizer is None else len(tokenizer(text, add_special_tokens=True, verbose=False).input_ids)


@lru_cache(maxsize=4)
def _tokenizer(model: str, fingerprint: str) -> Any:
    """The tokenizer the pipeline loads (model_index.json's class, local files only), once per model;
    None when it does not load (the model load then says why)."""
    if model in CogVideoXFamily.tiny_models:
        from sagevideo.pipelines.tiny import tiny_tokenizer

        return tiny_tokenizer()
    try:
        import transformers

        library, name = json.loads((Path(model) / "model_index.json").read_text(encoding="utf-8"))["tokenizer"]
        cls = getattr(transformers, name) if library == "transformers" else transformers.AutoTokenizer
        return cls.from_pretrained(Path(model) / "tokenizer", local_files_only=True)
    except Exception:  # noqa: BLE001 - any failure: no count, no note; the load reports a broken folder
        return None


FAMILY = CogVideoXFamily()


def _latent_grid(transformer: Any, args: tuple, kwargs: dict) -> tuple[int, int, int] | None:
    """The video tokens' grid of a CogVideoX forward: latents (B, F, C, H, W), patched by `patch_size`
    in space and `patch_size_t` (CogVideoX 1.5; None: 1) in time, tokens in (frame, row, column) order."""
    latents = forward_input(args, kwargs, "hidden_states")
    if latents is None or latents.dim() != 5:
        return None
    p, p_t = transformer.config.patch_size, transformer.config.patch_size_t or 1
    frames, _, height, width = latents.shape[1:]
    return frames // p_t, height // p, width // p
