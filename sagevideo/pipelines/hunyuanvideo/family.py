"""The HunyuanVideo family (diffusers `HunyuanVideoPipeline`, text to video): what generate, ab,
calibrate and `--gpus-per-job` need to know of it. Registered in `sagevideo.pipelines.families`.

- models: the built-in "tiny-hunyuanvideo" (`hunyuanvideo.tiny`) and local `HunyuanVideoPipeline`
  folders (transformer, vae, text_encoder (Llama), text_encoder_2 (CLIP) with safetensors;
  tokenizer, tokenizer_2 and scheduler configs); Tencent's original release is refused with how
  to convert it (`unconverted_hint`);
- job constraints: height and width multiples of VAE x patch (16), frames 1 + 4k (the VAE
  compresses time 4x after the first frame), prompts of at most 256 Llama tokens after the
  template (longer ones would be cut without a word: refused before loading), no negative prompt
  (HunyuanVideo is guidance-distilled: `guidance` is the embedded guidance scale, there is no
  unconditional pass); the mp4 gets HunyuanVideo's 24 fps unless --fps says otherwise;
- attention: no processor of its own. diffusers' HunyuanVideo processors call SDPA through the
  attention dispatcher, so `install` intercepts SDPA inside the transformer. The dual- and
  single-stream blocks pass a boolean key-padding mask (B, 1, 1, video + text) over the padded
  text: it runs in the kernels. The token refiner's 2 layers mask queries as well as keys
  (B, H, 256, 256): SDPA, recorded as a fallback with that reason (under every backend);
- layer names: `context_embedder.token_refiner.refiner_blocks.N.attn`, `transformer_blocks.N.attn`,
  `single_transformer_blocks.N.attn` (install's order); block-sparse: the dual- and single-stream
  layers ([video; text], text last; the refiner never), the grid of the latents (B, C, F, H, W)
  after the patch;
- sequence parallelism: `sequence_parallel.shard_hunyuanvideo` (text replicated, video split),
  degrees that divide the heads and the video tokens.
Nothing here imports torch or diffusers at import time.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from sagevideo.errors import InputError
from sagevideo.jobs.specs import JobSpec
from sagevideo.pipelines.families import (
    TEXT_LAST,
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

TRANSFORMER_CLASS = "HunyuanVideoTransformer3DModel"
TEXT_TOKENS = 256  # HunyuanVideoPipeline's max_sequence_length
FPS = 24  # the frame rate HunyuanVideo was trained and released at (129 frames: about 5 s)
# HunyuanVideoPipeline.__call__'s defaults: 720p, 129 frames (about 5 s at 24 fps), 50 steps.
DEFAULTS = dict(height=720, width=1280, frames=129, steps=50)
# Tencent's original release layout (not loadable: `unconverted_hint` says how to convert it).
ORIGINAL_FOLDER = "hunyuan-video-t2v-720p"
ORIGINAL_TRANSFORMER = "transformers/mp_rank_00_model_states.pt"
# Folders a model folder must have besides the weight folders (what the pipeline loads from configs).
CONFIG_FOLDERS = ("tokenizer", "tokenizer_2", "scheduler")


def transformer_config(source: ModelSource) -> SimpleNamespace:
    """What layer names and the degree check need of the transformer's config, from JSON only:
    tiny's built-in config, or the folder's transformer/config.json."""
    if source.is_tiny:
        from sagevideo.pipelines.hunyuanvideo.tiny import TRANSFORMER_CONFIG

        cfg = {"_class_name": TRANSFORMER_CLASS, **TRANSFORMER_CONFIG}
    else:
        # resolve_model already read this file, so it exists and is a JSON object.
        cfg = json.loads((source.path / "transformer" / "config.json").read_text(encoding="utf-8"))
    return SimpleNamespace(
        class_name=cfg.get("_class_name"),
        num_attention_heads=source.heads,
        patch_size=source.patch,
        patch_size_t=cfg.get("patch_size_t", 1),
        num_layers=cfg.get("num_layers", 20),
        num_single_layers=cfg.get("num_single_layers", 40),
        num_refiner_layers=cfg.get("num_refiner_layers", 2),
        image_condition_type=cfg.get("image_condition_type"),
    )


def llama_tokenizer(source: ModelSource) -> Any:
    """The pipeline's Llama tokenizer (no weights): tiny's, or the folder's tokenizer/."""
    from sagevideo.pipelines.hunyuanvideo import prompts

    if source.is_tiny:
        return prompts.tiny_tokenizer()
    try:
        return prompts.folder_tokenizer(str(source.path))
    except Exception as err:  # transformers raises OSError, ValueError, JSON errors... for a broken folder
        raise InputError(
            f"--model {source.path}: tokenizer/ cannot be read as a tokenizer ({type(err).__name__}: {err}); "
            "it must hold HunyuanVideo's Llama tokenizer (a save_pretrained output)"
        ) from None


class HunyuanVideoFamily(ModelFamily):
    name = "hunyuanvideo"
    title = "HunyuanVideo"
    pipeline_classes = ("HunyuanVideoPipeline",)
    tiny_models = ("tiny-hunyuanvideo",)
    weight_components = ("transformer", "vae", "text_encoder", "text_encoder_2")
    generates = True
    sequence_parallel = True

    # --- detection and loading ---

    def tiny_source(self, name: str) -> ModelSource:
        from sagevideo.pipelines.hunyuanvideo import tiny

        cfg, vae = tiny.TRANSFORMER_CONFIG, tiny.VAE_CONFIG
        return ModelSource(
            name=name,
            path=None,
            fingerprint=fingerprint([cfg, vae, tiny.LLAMA_CONFIG, tiny.CLIP_CONFIG, tiny.SCHEDULER_CONFIG,
                                     tiny.TINY_SEED, tiny.DEFAULT_HEIGHT, tiny.DEFAULT_FRAMES]),
            pipeline_class="HunyuanVideoPipeline",
            heads=cfg["num_attention_heads"],
            head_dim=cfg["attention_head_dim"],
            spatial=vae["spatial_compression_ratio"],
            temporal=vae["temporal_compression_ratio"],
            patch=cfg["patch_size"],
            text_tokens=tiny.TEXT_TOKENS,
            default_height=tiny.DEFAULT_HEIGHT,
            default_width=tiny.DEFAULT_WIDTH,
            default_frames=tiny.DEFAULT_FRAMES,
            default_steps=tiny.DEFAULT_STEPS,
            layers=cfg["num_layers"] + cfg["num_single_layers"],
            vae_channels=vae["block_out_channels"][0],
            family=self.name,
            default_fps=FPS,
        )

    def folder_source(self, path: Path, index: dict[str, Any], model: str) -> ModelSource:
        where = f"--model {model}"
        cfg = read_json(path / "transformer" / "config.json", where, "the transformer/ folder is incomplete")
        vae = read_json(path / "vae" / "config.json", where, "the vae/ folder is incomplete")
        for folder in CONFIG_FOLDERS:
            if not (path / folder).is_dir() or not any((path / folder).iterdir()):
                raise InputError(
                    f"{where}: {folder}/ is missing or empty in {path}; a HunyuanVideoPipeline folder has "
                    f"transformer/, vae/, text_encoder/ (Llama), text_encoder_2/ (CLIP), tokenizer/, tokenizer_2/ "
                    "and scheduler/ (a save_pretrained output)"
                )
        if cfg.get("_class_name") != TRANSFORMER_CLASS or cfg.get("image_condition_type") is not None:
            what = cfg.get("_class_name") if cfg.get("_class_name") != TRANSFORMER_CLASS else \
                f"{TRANSFORMER_CLASS} with image_condition_type {cfg.get('image_condition_type')!r} (image to video)"
            raise InputError(f"{where}: transformer/config.json names {what}; the HunyuanVideo family runs the "
                             f"text-to-video {TRANSFORMER_CLASS} (image_condition_type null)")
        return ModelSource(
            name=str(path),
            path=path,
            fingerprint=folder_fingerprint(path),
            pipeline_class=index["_class_name"],
            heads=cfg.get("num_attention_heads", 24),
            head_dim=cfg.get("attention_head_dim", 128),
            spatial=vae.get("spatial_compression_ratio", 8),
            temporal=vae.get("temporal_compression_ratio", 4),
            patch=cfg.get("patch_size", 2),
            text_tokens=TEXT_TOKENS,
            default_height=DEFAULTS["height"],
            default_width=DEFAULTS["width"],
            default_frames=DEFAULTS["frames"],
            default_steps=DEFAULTS["steps"],
            layers=cfg.get("num_layers", 20) + cfg.get("num_single_layers", 40),
            vae_channels=(vae.get("block_out_channels") or (128,))[0],
            family=self.name,
            default_fps=FPS,
        )

    def unconverted_hint(self, path: Path) -> str | None:
        """Tencent's original release (tencent/HunyuanVideo: hunyuan-video-t2v-720p/transformers/
        mp_rank_00_model_states.pt, a .pt VAE) is not a diffusers folder."""
        original = [path / ORIGINAL_TRANSFORMER, path / ORIGINAL_FOLDER / ORIGINAL_TRANSFORMER]
        if not any(p.is_file() for p in original):
            return None
        return (
            "this is Tencent's original HunyuanVideo release, not a diffusers folder (no model_index.json); "
            "use the diffusers-format hunyuanvideo-community/HunyuanVideo, or convert this one with diffusers' "
            "scripts/convert_hunyuan_video_to_diffusers.py and save the HunyuanVideoPipeline with "
            "save_pretrained(..., safe_serialization=True)"
        )

    def load(self, source: ModelSource, device: str, dtype: Any) -> Any:
        import torch

        if source.is_tiny:
            from sagevideo.pipelines.hunyuanvideo.tiny import tiny_pipeline

            pipe = tiny_pipeline()
            for module in (pipe.transformer, pipe.vae, pipe.text_encoder, pipe.text_encoder_2):
                torch.nn.Module.to(module, device=device, dtype=dtype)  # see the CogVideoX family
            return pipe
        from diffusers import HunyuanVideoPipeline

        with quiet_from_pretrained():
            pipe = HunyuanVideoPipeline.from_pretrained(
                source.path, local_files_only=True, use_safetensors=True, torch_dtype=dtype
            )
        pipe.to(device)
        # As diffusers' HunyuanVideo example: 720p x 129 frames decode in spatial tiles (no effect below
        # 256 px, e.g. on saved tiny models).
        pipe.vae.enable_tiling()
        return pipe

    # --- job constraints ---

    def forward_batch(self, source: ModelSource, job: JobSpec) -> int:
        return 1  # guidance-distilled: the scale is an embedding, one conditional forward per step

    def job_problems(self, source: ModelSource, job: JobSpec) -> list[str]:
        problems = size_problems(source, job)
        temporal = source.temporal
        if (job.frames - 1) % temporal:
            near = (job.frames - 1) // temporal * temporal + 1
            problems.append(
                f"frames: {job.frames} is not 1 + a multiple of {temporal} (the VAE compresses time {temporal}x "
                f"after the first frame); use e.g. {near} or {near + temporal}"
            )
        if job.negative_prompt:
            problems.append(
                "negative_prompt: HunyuanVideo is guidance-distilled (guidance is the transformer's embedded "
                "guidance scale; there is no unconditional pass a negative prompt could steer); remove it"
            )
        from sagevideo.pipelines.hunyuanvideo.prompts import prompt_tokens

        tokens = prompt_tokens(llama_tokenizer(source), job.prompt)
        if tokens > source.text_tokens:
            problems.append(
                f"prompt: {tokens} tokens (with the closing <|eot_id|>), and {self.title} reads "
                f"{source.text_tokens}: the last {tokens - source.text_tokens} would be cut without a word; "
                "shorten the prompt"
            )
        return problems

    def attention_layers(self, source: ModelSource) -> list[str]:
        cfg = transformer_config(source)
        return [
            *(f"context_embedder.token_refiner.refiner_blocks.{i}.attn" for i in range(cfg.num_refiner_layers)),
            *(f"transformer_blocks.{i}.attn" for i in range(cfg.num_layers)),
            *(f"single_transformer_blocks.{i}.attn" for i in range(cfg.num_single_layers)),
        ]

    # --- generation ---

    def denoise(self, pipe: Any, job: JobSpec, *, generator: Any, text_tokens: int, callback: Any,
                image: Any = None) -> Any:
        from sagevideo.pipelines.hunyuanvideo.prompts import prompt_template

        # guidance_scale is the embedded guidance; true CFG (true_cfg_scale) stays off
        (latents,) = pipe(
            prompt=job.prompt,
            prompt_template=prompt_template(pipe.tokenizer),
            **latent_call_options(job, generator=generator, callback=callback, text_tokens=text_tokens),
        )
        return latents

    def decode(self, pipe: Any, job: JobSpec, latents: Any) -> Any:
        # What HunyuanVideoPipeline does after its loop for output_type != "latent".
        latents = latents.to(pipe.vae.dtype) / pipe.vae.config.scaling_factor
        return pipe.vae.decode(latents, return_dict=False)[0]  # (1, 3, F, H, W) in [-1, 1]

    def sparse_layout(self, transformer: Any) -> SparseLayout | None:
        if not is_exactly(transformer, "diffusers", TRANSFORMER_CLASS):
            return None
        layers = (key.removesuffix(".processor") for key in transformer.attn_processors)
        return SparseLayout({layer: TEXT_LAST for layer in layers if not layer.startswith("context_embedder.")},
                            _latent_grid)

    # --- sequence parallelism ---

    def shardable(self, source: ModelSource) -> str | None:
        config = transformer_config(source)
        if config.class_name == TRANSFORMER_CLASS and config.image_condition_type is None:
            return None
        return f"{source.pipeline_class} with a {config.class_name}"

    def shard(self, pipe_or_transformer: Any, *, group: Any = None, plan: Any = None, pv: str | None = None,
              backend: str = "auto") -> Any:
        from sagevideo.pipelines.hunyuanvideo.sequence_parallel import shard_hunyuanvideo

        return shard_hunyuanvideo(pipe_or_transformer, group=group, plan=plan, pv=pv, backend=backend)

    def degree_problem(self, source: ModelSource, job: JobSpec, degree: int) -> str | None:
        from sagevideo.pipelines.hunyuanvideo.sequence_parallel import check_hunyuanvideo_degree

        return ulysses_degree_problem(check_hunyuanvideo_degree, transformer_config(source), source, job, degree)


FAMILY = HunyuanVideoFamily()


def _latent_grid(transformer: Any, args: tuple, kwargs: dict) -> tuple[int, int, int] | None:
    """The video tokens' grid of a HunyuanVideo forward: latents (B, C, F, H, W) over its patch."""
    latents = forward_input(args, kwargs, "hidden_states")
    if latents is None or latents.dim() != 5:
        return None
    p, p_t = transformer.config.patch_size, transformer.config.patch_size_t
    frames, height, width = latents.shape[2:]
    return frames // p_t, height // p, width // p
