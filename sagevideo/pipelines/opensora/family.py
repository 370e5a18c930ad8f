"""The Open-Sora 2.0 family (sagevideo's `OpenSoraPipeline`), registered in `sagevideo.pipelines.families`.

- models: the built-in "tiny-opensora" (`opensora.tiny`) and local Open-Sora folders
  (`opensora.folder`: the diffusers-style layout `sagevideo convert-opensora` writes from the
  official download, and `OpenSoraPipeline.save_pretrained` writes too); an official download
  given as --model is refused with the conversion command (`unconverted_hint`);
- job constraints, from configs only: height and width multiples of 16 (VAE 8x times patch 2)
  and, for the released architecture (24 heads of 128, 19 + 38 blocks), a size of the official
  aspect table at 256px or 768px (`opensora.aspect`); frames 1 + 4k (the VAE compresses time 4x
  after the first frame; default 129); the prompt and the negative prompt within the 512 T5
  tokens the model reads, the official suffix " 24 FPS. 4 motion score." included; mp4s at the
  official 24 fps unless --fps says otherwise;
- input images: optional (`image_input` "optional"): a job with an `image:` starts from it as
  its first frame (the official i2v_head), one without is text-to-video. Any image size: it is
  resized to cover the video and center-cropped, as the official sampler does (no aspect refusal);
- attention: `OpenSoraAttnProcessor` -> `SageOpenSoraAttnProcessor`, one `attn` per block; plans
  name layers `transformer_blocks.{i}.attn` (official `double_blocks.{i}`) and
  `single_transformer_blocks.{j}.attn` (official `single_blocks.{j}`); block-sparse: every layer
  ([text; image], text first), the grid read from the forward's `img_ids` (t, h, w positions);
- generation: the pipeline's three-branch guidance loop with diffusers' per-step callback, and its
  VAE decode (the official spatial tiling);
- sequence parallelism: `sequence_parallel.shard_opensora` (text replicated on every rank, image
  tokens split), degrees that divide the heads and the image tokens.
Nothing here imports torch or diffusers at import time.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

from sagevideo.jobs.specs import JobSpec
from sagevideo.pipelines.families import (
    TEXT_FIRST,
    ModelFamily,
    SparseLayout,
    forward_input,
    is_exactly,
    latent_call_options,
    patch_grid,
    size_problems,
)
from sagevideo.pipelines.loading import ModelSource, fingerprint, folder_fingerprint

TINY = "tiny-opensora"
T5_TOKENS = 512  # the official sampler pads (and cuts) prompts to 512 T5 tokens
DEFAULT_FPS = 24  # the official configs' fps_save, and the " 24 FPS." of every prompt
DEFAULT_GUIDANCE = 7.5  # the official sampling configs' text guidance
MOTION_SCORE = 4  # the official configs' motion_score: " 4 motion score."
DEFAULT_FRAMES = 129
DEFAULT_STEPS = 50
# The released Open_Sora_v2 architecture, as ModelSource says it (heads, head dim, attention layers).
RELEASED = dict(heads=24, head_dim=128, layers=19 + 38)


def transformer_config(source: ModelSource) -> dict[str, Any]:
    """The transformer's config from JSON only: tiny's built-in one, or the folder's transformer/config.json
    (read by `folder_source` already, so it exists)."""
    if source.is_tiny:
        from sagevideo.pipelines.opensora.tiny import TRANSFORMER_CONFIG

        return dict(TRANSFORMER_CONFIG)
    return json.loads((source.path / "transformer" / "config.json").read_text(encoding="utf-8"))


def is_released(source: ModelSource) -> bool:
    """Whether the model has the released architecture (then it was trained at the aspect table's sizes)."""
    return all(getattr(source, key) == value for key, value in RELEASED.items())


@lru_cache(maxsize=4)
def _tokenizer(folder: str | None) -> Any:
    """The T5 tokenizer the pipeline uses (tiny: the byte-level one), for counting prompt tokens."""
    if folder is None:
        from sagevideo.pipelines.tiny import tiny_tokenizer

        return tiny_tokenizer()
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder, local_files_only=True)


def prompt_tokens(source: ModelSource, text: str) -> int:
    """T5 tokens of `text` as the pipeline encodes it (with the end-of-text token)."""
    tokenizer = _tokenizer(None if source.is_tiny else str(source.path / "tokenizer"))
    return len(tokenizer(text, truncation=False).input_ids)


class OpenSoraFamily(ModelFamily):
    name = "opensora"
    title = "Open-Sora 2.0"
    pipeline_classes = ("OpenSoraPipeline",)
    tiny_models = (TINY,)
    # Its jobs may start from an image (`image_input` says "optional", not the default "required").
    image_pipeline_classes = ("OpenSoraPipeline",)
    # `folder.check_folder` checks every part (weights included) and names all that is wrong at once.
    weight_components = ()
    generates = True
    sequence_parallel = True
    # diffusers' CacheMixin with its blocks registered (transformer.register_cache_blocks); pyramid
    # broadcast hooks only diffusers' own attention classes, so it would hook nothing here.
    step_caches = ("first-block", "taylorseer")

    # --- detection and loading ---

    def tiny_source(self, name: str) -> ModelSource:
        from sagevideo.pipelines.opensora import tiny

        cfg, vae = tiny.TRANSFORMER_CONFIG, tiny.VAE_CONFIG
        return ModelSource(
            name=name,
            path=None,
            fingerprint=fingerprint([cfg, vae, tiny.T5_CONFIG, tiny.CLIP_CONFIG, tiny.TINY_SEED, tiny.DEFAULT_HEIGHT,
                                     tiny.DEFAULT_WIDTH, tiny.DEFAULT_FRAMES, "opensora"]),
            pipeline_class="OpenSoraPipeline",
            heads=cfg["num_heads"],
            head_dim=cfg["hidden_size"] // cfg["num_heads"],
            spatial=2 ** (len(vae["block_out_channels"]) - 1),
            temporal=4,  # AutoencoderKLHunyuanVideo's temporal_compression_ratio
            patch=cfg["patch_size"],
            text_tokens=tiny.TEXT_TOKENS,
            default_height=tiny.DEFAULT_HEIGHT,
            default_width=tiny.DEFAULT_WIDTH,
            default_frames=tiny.DEFAULT_FRAMES,
            default_steps=tiny.DEFAULT_STEPS,
            layers=cfg["depth"] + cfg["depth_single_blocks"],
            vae_channels=vae["block_out_channels"][0],
            family=self.name,
            default_fps=DEFAULT_FPS,
            default_guidance=DEFAULT_GUIDANCE,
        )

    def folder_source(self, path: Path, index: dict[str, Any], model: str) -> ModelSource:
        from sagevideo.pipelines.opensora.aspect import image_size
        from sagevideo.pipelines.opensora.folder import check_folder

        configs = check_folder(path, f"--model {model}")
        cfg, vae = configs["transformer"], configs["vae"]
        heads = cfg.get("num_heads", 24)
        height, width = image_size()  # the official default: 256px 16:9
        return ModelSource(
            name=str(path),
            path=path,
            fingerprint=folder_fingerprint(path),
            pipeline_class=index["_class_name"],
            heads=heads,
            head_dim=cfg.get("hidden_size", 3072) // heads,
            spatial=vae.get("spatial_compression_ratio", 8),
            temporal=vae.get("temporal_compression_ratio", 4),
            patch=cfg.get("patch_size", 2),
            text_tokens=T5_TOKENS,
            default_height=height,
            default_width=width,
            default_frames=DEFAULT_FRAMES,
            default_steps=DEFAULT_STEPS,
            layers=cfg.get("depth", 19) + cfg.get("depth_single_blocks", 38),
            vae_channels=(vae.get("block_out_channels") or (128,))[0],
            family=self.name,
            default_fps=DEFAULT_FPS,
            default_guidance=DEFAULT_GUIDANCE,
        )

    def unconverted_hint(self, path: Path) -> str | None:
        """The convert-opensora command for an official download (Open_Sora_v2.safetensors inside)."""
        from sagevideo.pipelines.opensora.folder import looks_official

        return looks_official(path)

    def load(self, source: ModelSource, device: str, dtype: Any) -> Any:
        import torch

        if source.is_tiny:
            from sagevideo.pipelines.opensora.tiny import tiny_pipeline

            pipe = tiny_pipeline()
            for module in (pipe.transformer, pipe.vae, pipe.text_encoder, pipe.text_encoder_2):
                torch.nn.Module.to(module, device=device, dtype=dtype)  # see the CogVideoX family: no fp32 warning
            return pipe
        from sagevideo.pipelines.opensora.folder import load_folder

        return load_folder(source.path, device, dtype)

    # --- job constraints ---

    def forward_batch(self, source: ModelSource, job: JobSpec) -> int:
        return 3  # the pipeline always runs conditional, text-unconditional and image-unconditional as one call

    def job_problems(self, source: ModelSource, job: JobSpec) -> list[str]:
        from sagevideo.pipelines.opensora.aspect import size_problem
        from sagevideo.pipelines.opensora.prompts import add_prompt_suffixes

        problems = size_problems(source, job)
        if not problems and is_released(source):
            problem = size_problem(job.height, job.width)
            if problem:
                problems.append(problem)
        if (job.frames - 1) % source.temporal:
            near = (job.frames - 1) // source.temporal * source.temporal + 1
            problems.append(
                f"frames: {job.frames} is not 1 + a multiple of {source.temporal} (the VAE compresses time "
                f"{source.temporal}x after the first frame); use e.g. {near} or {near + source.temporal}"
            )
        for field, text in (("prompt", add_prompt_suffixes(job.prompt, DEFAULT_FPS, MOTION_SCORE)),
                            ("negative_prompt", job.negative_prompt)):
            if not text:
                continue
            tokens = prompt_tokens(source, text)
            if tokens > source.text_tokens:
                suffix = " with the official suffix ' 24 FPS. 4 motion score.'" if field == "prompt" else ""
                cut = ", suffix included" if suffix else ""
                problems.append(
                    f"{field}: {tokens} T5 tokens{suffix}, but {self.title} reads {source.text_tokens} (the rest "
                    f"would be cut{cut}); shorten it by {tokens - source.text_tokens} tokens"
                )
        return problems

    def image_input(self, source: ModelSource) -> str | None:
        return "optional"  # one model: text-to-video, or image-to-video from a first frame

    def image_problems(self, source: ModelSource, job: JobSpec, image: Any) -> list[str]:
        return []  # any size: resized to cover the video and center-cropped (`prepare_image`)

    def attention_layers(self, source: ModelSource) -> list[str]:
        cfg = transformer_config(source)
        return [f"transformer_blocks.{i}.attn" for i in range(cfg.get("depth", 19))] + [
            f"single_transformer_blocks.{j}.attn" for j in range(cfg.get("depth_single_blocks", 38))
        ]

    # --- generation ---

    def prepare_image(self, image: Any, job: JobSpec) -> Any:
        """The decoded image as a PIL image of the job's size: resized (bicubic) to cover it and
        center-cropped, the official sampler's "resize_crop" of reference images."""
        from sagevideo.jobs.images import as_pil
        from sagevideo.pipelines.opensora.pipeline import resize_crop_to_fill

        return resize_crop_to_fill(as_pil(image), job.height, job.width)

    def denoise(self, pipe: Any, job: JobSpec, *, generator: Any, text_tokens: int, callback: Any,
                image: Any = None) -> Any:
        (latents,) = pipe(
            prompt=job.prompt,
            image=image,  # None: text-to-video
            negative_prompt=job.negative_prompt or None,
            fps=DEFAULT_FPS,
            motion_score=MOTION_SCORE,
            **latent_call_options(job, generator=generator, callback=callback, text_tokens=text_tokens),
        )
        return latents

    def decode(self, pipe: Any, job: JobSpec, latents: Any) -> Any:
        return pipe.decode_latents(latents)  # (1, 3, F, H, W) in [-1, 1], the VAE's dtype

    # --- attention routes ---

    def processor_routes(self) -> dict[type, Any]:
        from sagevideo.pipelines.opensora.processor import OpenSoraAttnProcessor, SageOpenSoraAttnProcessor

        return {OpenSoraAttnProcessor: SageOpenSoraAttnProcessor}

    def sparse_layout(self, transformer: Any) -> SparseLayout | None:
        if not is_exactly(transformer, "sagevideo.pipelines.opensora.transformer", "OpenSoraTransformer3DModel"):
            return None
        return SparseLayout({key.removesuffix(".processor"): TEXT_FIRST for key in transformer.attn_processors},
                            _latent_grid)

    # --- sequence parallelism ---

    def shard(self, pipe_or_transformer: Any, *, group: Any = None, plan: Any = None, pv: str | None = None,
              backend: str = "auto") -> Any:
        from sagevideo.pipelines.opensora.sequence_parallel import shard_opensora

        return shard_opensora(pipe_or_transformer, group=group, plan=plan, pv=pv, backend=backend)

    def degree_problem(self, source: ModelSource, job: JobSpec, degree: int) -> str | None:
        # The text tokens are on every rank; the packed image tokens are split (`shard_opensora`).
        latent_frames, rows, cols = patch_grid(source, job)
        image = latent_frames * rows * cols
        if image % degree:
            return (f"{image} image tokens ({latent_frames} latent frames x {rows}x{cols}) are not divisible by "
                    f"{degree} (each rank takes an equal share of them; the {source.text_tokens} text tokens are "
                    "on every rank); change frames/size or the degree")
        return None


FAMILY = OpenSoraFamily()


def _latent_grid(transformer: Any, args: tuple, kwargs: dict) -> tuple[int, int, int] | None:
    """The image tokens' grid of an Open-Sora forward, from `img_ids` (B, L, 3) (t, h, w positions in
    `packing.pack_latents` order): their largest values + 1 (one host read, before the forward),
    None unless they fill that grid."""
    ids = forward_input(args, kwargs, "img_ids", 1)
    if ids is None or ids.dim() != 3 or ids.shape[-1] != 3:
        return None
    grid = tuple(int(n) + 1 for n in ids[0].amax(dim=0).tolist())
    return grid if grid[0] * grid[1] * grid[2] == ids.shape[1] else None
