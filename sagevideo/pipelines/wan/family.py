"""The Wan family (diffusers `WanPipeline` and `WanImageToVideoPipeline`): what generate, ab,
calibrate and `--gpus-per-job` need to know of Wan 2.1 (1.3B, 14B; text- and image-to-video) and
Wan 2.2 (A14B text- and image-to-video, TI2V-5B). Registered in `sagevideo.pipelines.families`.

- models: the built-in `tiny-wan`, `tiny-wan22`, `tiny-wan-i2v` and `tiny-wan22-ti2v` (`wan.tiny`)
  and local folders of either pipeline. Wan 2.2 A14B has a second denoiser, `transformer_2`, for the
  timesteps below the pipeline's `boundary_ratio`: both are loaded and both get sagevideo attention.
  Wan 2.1 I2V adds a CLIP `image_encoder` (its image tokens are extra cross-attention keys);
- input images: `WanImageToVideoPipeline` models require one per job; a TI2V-5B folder (`WanPipeline`
  with `expand_timesteps`) takes one optionally: diffusers makes image-to-video with that model
  through `WanImageToVideoPipeline(expand_timesteps=True)` over the same components, which
  `denoise` builds for such jobs;
- job constraints: height and width multiples of VAE x patch (8 x 2 = 16; TI2V-5B's VAE 16 x 2 =
  32), frames 1 + 4k (the VAE compresses time 4x after the first frame), at most `rope_max_seq_len`
  latent frames/rows/columns, prompts of at most 512 umT5 tokens (the pipeline would cut the rest
  without a word); mp4s at the release's rate (16 fps; TI2V-5B 24);
- attention: diffusers' dispatcher (`WanAttnProcessor` -> SDPA), so `install` intercepts SDPA
  inside each denoiser's forward; layers `blocks.N.attn1` (self-attention over the video tokens)
  and `blocks.N.attn2` (cross-attention to the text, and to the image tokens of Wan 2.1 I2V: two
  calls of one layer), those of `transformer_2` prefixed `transformer_2.` as `install` names them;
  block-sparse: the `attn1` layers (video only; `attn2` never), the grid of the latents
  (B, C, F, H, W) after the (t, h, w) patch;
- sequence parallelism: `sequence_parallel.shard_wan` (sagevideo's Ulysses around the
  interception: video tokens split, text replicated), degrees that divide the heads and the video
  tokens.
Nothing here imports torch or diffusers at import time.
"""

from __future__ import annotations

import html
import re
from functools import lru_cache
from pathlib import Path
from typing import Any

from sagevideo.errors import InputError
from sagevideo.jobs.specs import JobSpec
from sagevideo.pipelines.families import (
    ModelFamily,
    SparseLayout,
    forward_input,
    is_exactly,
    latent_call_options,
    patch_grid,
    size_problems,
)
from sagevideo.pipelines.loading import (
    ModelSource,
    fingerprint,
    folder_fingerprint,
    quiet_from_pretrained,
    read_json,
)

TRANSFORMER_CLASS = "WanTransformer3DModel"  # the one sagevideo runs and splits (not VACE's or Animate's)
TEXT_TO_VIDEO, IMAGE_TO_VIDEO = "WanPipeline", "WanImageToVideoPipeline"
DENOISERS = ("transformer", "transformer_2")
# Components every Wan folder's model_index.json names, besides the denoisers.
COMPONENTS = ("tokenizer", "text_encoder", "vae", "scheduler")
TEXT_TOKENS = 512  # umT5's context in Wan; WanAttnProcessor assumes exactly 512 to split off the image tokens
FPS, TI2V_FPS = 16, 24  # the frame rates Wan 2.1 / 2.2 A14B and Wan 2.2 TI2V-5B are released at
GUIDANCE = 5.0  # WanPipeline's default guidance_scale, the released sampling setting
DEFAULT_SIZE = (480, 832, 81)  # height, width, frames: the pipelines' defaults (Wan 2.1 480p)
TI2V_DEFAULT_SIZE = (704, 1280, 121)  # TI2V-5B's release setting (720p, 5 s at 24 fps)
ROPE_MAX_SEQ_LEN = 1024  # WanTransformer3DModel's default rotary table length
# Files of the official (non-diffusers) Wan releases, which `from_pretrained` cannot read.
ORIGINAL_CHECKPOINT_FILES = ("Wan2.1_VAE.pth", "Wan2.2_VAE.pth", "models_t5_umt5-xxl-enc-bf16.pth")


def pipeline_index(source: ModelSource) -> dict[str, Any]:
    """The model's `model_index.json` (a tiny model's as `save_pretrained` would write it): its
    `_class_name`, `boundary_ratio`, `expand_timesteps` and component entries."""
    if source.is_tiny:
        from sagevideo.pipelines.wan.tiny import MODELS

        spec = MODELS[source.name]
        listed = ["diffusers", TRANSFORMER_CLASS]
        return {**spec.index(), "transformer": listed,
                "transformer_2": listed if spec.boundary_ratio is not None else [None, None],
                "image_encoder": ["transformers", "CLIPVisionModel"] if spec.image_encoder else [None, None]}
    return _read_index(source.path, source.fingerprint)


@lru_cache(maxsize=8)
def _read_index(path: Path, fingerprint: str) -> dict[str, Any]:
    return read_json(path / "model_index.json", f"--model {path}", "give the diffusers folder")


def denoiser_configs(source: ModelSource) -> dict[str, dict[str, Any]]:
    """Component -> transformer config (JSON only) of every denoiser, `transformer` first."""
    index = pipeline_index(source)
    if source.is_tiny:
        from sagevideo.pipelines.wan.tiny import MODELS

        cfg = {"_class_name": TRANSFORMER_CLASS, **MODELS[source.name].transformer}
        return {name: cfg for name in DENOISERS if _listed(index.get(name))}
    return {name: read_json(source.path / name / "config.json", f"--model {source.name}", "")
            for name in DENOISERS if _listed(index.get(name))}


def _listed(entry: Any) -> bool:
    """Whether a model_index.json entry names a component (["diffusers", "Class"], not [null, null])."""
    return isinstance(entry, (list, tuple)) and len(entry) == 2 and all(isinstance(e, str) for e in entry)


def video_tokens(source: ModelSource, job: JobSpec) -> int:
    """Video tokens of one transformer call for a resolved job (latent frames x patches)."""
    frames, rows, columns = patch_grid(source, job)
    return frames * rows * columns


class WanFamily(ModelFamily):
    """Wan 2.1 / 2.2 (see the module docstring). Memory estimate: self-attention over the video
    tokens only (the text is in cross-attention), one guidance branch per forward."""

    name = "wan"
    title = "Wan"
    pipeline_classes = (TEXT_TO_VIDEO, IMAGE_TO_VIDEO)
    image_pipeline_classes = (IMAGE_TO_VIDEO,)
    tiny_models = ("tiny-wan", "tiny-wan22", "tiny-wan-i2v", "tiny-wan22-ti2v")
    weight_components = ("transformer", "vae", "text_encoder")  # transformer_2, image_encoder: when listed
    generates = True
    sequence_parallel = True

    # --- detection and loading ---

    def tiny_source(self, name: str) -> ModelSource:
        from sagevideo.pipelines.wan import tiny

        spec = tiny.MODELS[name]
        cfg, vae = spec.transformer, spec.vae
        return ModelSource(
            name=name,
            path=None,
            fingerprint=fingerprint(
                [name, spec, tiny.T5_CONFIG, tiny.CLIP_CONFIG, tiny.SCHEDULER_CONFIG, tiny.TINY_SEED,
                 tiny.DEFAULT_HEIGHT, tiny.DEFAULT_FRAMES]
            ),
            pipeline_class=spec.pipeline_class,
            heads=cfg["num_attention_heads"],
            head_dim=cfg["attention_head_dim"],
            spatial=vae["scale_factor_spatial"],
            temporal=vae["scale_factor_temporal"],
            patch=cfg["patch_size"][1],
            text_tokens=tiny.TEXT_TOKENS,
            default_height=tiny.DEFAULT_HEIGHT,
            default_width=tiny.DEFAULT_WIDTH,
            default_frames=tiny.DEFAULT_FRAMES,
            default_steps=2,
            layers=cfg["num_layers"],
            vae_channels=vae["base_dim"],
            family=self.name,
            default_fps=spec.fps,
            default_guidance=GUIDANCE,
        )

    def folder_source(self, path: Path, index: dict[str, Any], model: str) -> ModelSource:
        where = f"--model {model}"
        kind = index["_class_name"]
        missing = [name for name in (*COMPONENTS, "transformer") if not _listed(index.get(name))]
        if missing:
            raise InputError(
                f"{where}: model_index.json names no {', '.join(missing)}; a {kind} folder has tokenizer, "
                "text_encoder, vae, scheduler and transformer (and transformer_2 for Wan 2.2 A14B)"
            )
        for name in COMPONENTS:
            folder = path / name
            if not folder.is_dir() or not any(folder.iterdir()):
                raise InputError(f"{where}: the {name}/ folder is missing or empty in {path}; model_index.json "
                                 "names it (copy the whole diffusers folder)")
        configs = {}
        for name in DENOISERS:
            if _listed(index.get(name)):
                _need_safetensors(path, name, where)
                configs[name] = read_json(path / name / "config.json", where, f"the {name}/ folder is incomplete")
        two = "transformer_2" in configs
        if two != (index.get("boundary_ratio") is not None):
            raise InputError(
                f"{where}: model_index.json has "
                + (f"transformer_2 but no boundary_ratio ({kind} would never run it)" if two
                   else f"boundary_ratio {index.get('boundary_ratio')} but no transformer_2")
                + "; Wan 2.2 A14B folders have both, Wan 2.1 and TI2V-5B folders neither"
            )
        cfg = configs["transformer"]
        for name, other in configs.items():
            if other.get("_class_name", TRANSFORMER_CLASS) != TRANSFORMER_CLASS:
                raise InputError(f"{where}: {name}/config.json is a {other.get('_class_name')}; sagevideo generate "
                                 f"runs {kind} folders with {TRANSFORMER_CLASS} denoisers")
            keys = ("num_attention_heads", "attention_head_dim", "patch_size", "in_channels", "image_dim")
            if [other.get(k) for k in keys] != [cfg.get(k) for k in keys]:
                raise InputError(f"{where}: transformer_2's heads, head dim, patch size or inputs differ from "
                                 "transformer's (both denoise the same latents)")
        if cfg.get("image_dim") is not None:  # Wan 2.1 I2V: CLIP image tokens in cross-attention
            if kind != IMAGE_TO_VIDEO:
                raise InputError(f"{where}: transformer/ takes CLIP image embeddings (image_dim) but model_index.json "
                                 f"names {kind}; such a transformer runs in {IMAGE_TO_VIDEO} folders")
            unlisted = [name for name in ("image_encoder", "image_processor") if not _listed(index.get(name))]
            if unlisted:
                raise InputError(f"{where}: model_index.json names no {', '.join(unlisted)}, which a Wan 2.1 "
                                 "image-to-video transformer (image_dim set) needs; copy the whole diffusers folder")
            _need_safetensors(path, "image_encoder", where)
        vae = read_json(path / "vae" / "config.json", where, "the vae/ folder is incomplete")
        patch = cfg.get("patch_size", (1, 2, 2))
        if not isinstance(patch, (list, tuple)) or len(patch) != 3 or patch[0] != 1 or patch[1] != patch[2]:
            raise InputError(f"{where}: transformer patch size {patch} is not (1, p, p) as in every Wan release")
        ti2v = bool(index.get("expand_timesteps"))
        height, width, frames = TI2V_DEFAULT_SIZE if ti2v else DEFAULT_SIZE
        return ModelSource(
            name=str(path),
            path=path,
            fingerprint=folder_fingerprint(path),
            pipeline_class=kind,
            heads=cfg.get("num_attention_heads", 40),
            head_dim=cfg.get("attention_head_dim", 128),
            # What the pipelines read (AutoencoderKLWan's defaults where the config predates them).
            spatial=vae.get("scale_factor_spatial", 8),
            temporal=vae.get("scale_factor_temporal", 4),
            patch=patch[1],
            text_tokens=TEXT_TOKENS,
            default_height=height,
            default_width=width,
            default_frames=frames,
            default_steps=50,
            layers=cfg.get("num_layers", 40),
            vae_channels=vae.get("decoder_base_dim") or vae.get("base_dim", 96),
            family=self.name,
            default_fps=TI2V_FPS if ti2v else FPS,
            default_guidance=GUIDANCE,
        )

    def unconverted_hint(self, path: Path) -> str | None:
        found = [name for name in ORIGINAL_CHECKPOINT_FILES if (path / name).exists()]
        if not found:
            return None
        return (f"{path} holds an original Wan checkpoint ({', '.join(found)}), not a diffusers folder; use its "
                "diffusers version (the Wan-AI/*-Diffusers repositories, e.g. Wan-AI/Wan2.1-T2V-1.3B-Diffusers) or "
                "convert it with diffusers' scripts/convert_wan_to_diffusers.py")

    def load(self, source: ModelSource, device: str, dtype: Any) -> Any:
        import torch

        if source.is_tiny:
            from sagevideo.pipelines.wan.tiny import tiny_pipeline

            pipe = tiny_pipeline(source.name)
            for name in ("transformer", "transformer_2", "text_encoder"):
                module = getattr(pipe, name, None)
                if module is not None:
                    cast_as_loaded(module, device, dtype)
            for name in ("vae", "image_encoder"):  # float32, as folders load them below
                module = getattr(pipe, name, None)
                if module is not None:
                    torch.nn.Module.to(module, device=device, dtype=torch.float32)
            return pipe
        import diffusers
        import transformers

        index = pipeline_index(source)
        common = dict(local_files_only=True, use_safetensors=True)
        with quiet_from_pretrained():
            # The VAE and the CLIP image encoder in float32, as Wan's own diffusers examples load them
            # (the VAE decoder is sensitive in bf16); the transformers and the text encoder in `dtype`.
            parts = {"vae": diffusers.AutoencoderKLWan.from_pretrained(
                source.path, subfolder="vae", torch_dtype=torch.float32, **common)}
            if _listed(index.get("image_encoder")):
                encoder = getattr(transformers, index["image_encoder"][1])
                parts["image_encoder"] = encoder.from_pretrained(
                    source.path, subfolder="image_encoder", torch_dtype=torch.float32, **common)
            pipe = getattr(diffusers, source.pipeline_class).from_pretrained(
                source.path, **parts, torch_dtype=dtype, **common)
        pipe.to(device)
        return pipe

    # --- job constraints ---

    def attention_tokens(self, source: ModelSource, job: JobSpec) -> int:
        return video_tokens(source, job)  # self-attention; the 512 text tokens are keys of attn2 only

    def forward_batch(self, source: ModelSource, job: JobSpec) -> int:
        return 1  # WanPipeline runs the conditional and unconditional branches as two forwards

    def job_problems(self, source: ModelSource, job: JobSpec) -> list[str]:
        problems = size_problems(source, job)
        temporal = source.temporal
        if (job.frames - 1) % temporal:
            near = (job.frames - 1) // temporal * temporal + 1
            problems.append(
                f"frames: {job.frames} is not 1 + a multiple of {temporal} (the VAE compresses time {temporal}x "
                f"after the first frame); use e.g. {near} or {near + temporal}"
            )
        rope = min(cfg.get("rope_max_seq_len", ROPE_MAX_SEQ_LEN) for cfg in denoiser_configs(source).values())
        for field, count in zip(("frames", "height", "width"), patch_grid(source, job), strict=True):
            if count > rope:
                problems.append(f"{field}: {getattr(job, field)} makes {count} transformer patches along it, more "
                                f"than its rotary table's {rope} (rope_max_seq_len); make it smaller")
        count = _token_counter(source)
        for field in ("prompt", "negative_prompt"):
            text = getattr(job, field)
            if not text:
                continue
            tokens = count(text)
            if tokens > source.text_tokens:
                problems.append(
                    f"{field}: {tokens} umT5 tokens, but Wan reads {source.text_tokens} (the pipeline would drop the "
                    f"last {tokens - source.text_tokens} without a word); shorten it"
                )
        return problems

    def attention_layers(self, source: ModelSource) -> list[str]:
        layers = []
        for component, cfg in denoiser_configs(source).items():
            prefix = "" if component == "transformer" else f"{component}."
            layers += [f"{prefix}blocks.{i}.attn{j}" for i in range(cfg.get("num_layers", 40)) for j in (1, 2)]
        return layers

    def image_input(self, source: ModelSource) -> str | None:
        if source.pipeline_class == IMAGE_TO_VIDEO:
            return "required"
        # TI2V-5B: text-to-video, or image-to-video through WanImageToVideoPipeline (see `denoise`).
        return "optional" if pipeline_index(source).get("expand_timesteps") else None

    # --- generation ---

    def denoise(self, pipe: Any, job: JobSpec, *, generator: Any, text_tokens: int, callback: Any,
                image: Any = None) -> Any:
        common = latent_call_options(job, generator=generator, callback=callback, text_tokens=text_tokens)
        if image is None:
            (latents,) = pipe(prompt=job.prompt, negative_prompt=job.negative_prompt or None, **common)
            return latents
        runner = image_pipeline(pipe)
        (latents,) = runner(image=image, **encode_prompts(runner, job, text_tokens), **common)
        return latents

    def decode(self, pipe: Any, job: JobSpec, latents: Any) -> Any:
        """As the Wan pipelines' own decode (same operations, so the same bits): latents
        un-normalized with the VAE's per-channel statistics, then the VAE in its dtype."""
        import torch

        vae = pipe.vae
        latents = latents.to(next(vae.parameters()).device, vae.dtype)
        shape = (1, vae.config.z_dim, 1, 1, 1)
        mean = torch.tensor(vae.config.latents_mean).view(shape).to(latents.device, latents.dtype)
        inverse_std = 1.0 / torch.tensor(vae.config.latents_std).view(shape).to(latents.device, latents.dtype)
        return vae.decode(latents / inverse_std + mean, return_dict=False)[0]  # (1, 3, F, H, W) in [-1, 1]

    def sparse_layout(self, transformer: Any) -> SparseLayout | None:
        if not is_exactly(transformer, "diffusers", TRANSFORMER_CLASS):
            return None
        layers = (key.removesuffix(".processor") for key in transformer.attn_processors)
        return SparseLayout({layer: None for layer in layers if layer.endswith(".attn1")}, _latent_grid)

    # --- sequence parallelism ---

    def shardable(self, source: ModelSource) -> str | None:
        classes = {cfg.get("_class_name", TRANSFORMER_CLASS) for cfg in denoiser_configs(source).values()}
        if source.pipeline_class in self.pipeline_classes and classes == {TRANSFORMER_CLASS}:
            return None
        return f"{source.pipeline_class} with a {', '.join(sorted(map(str, classes)))}"

    def shard(self, pipe_or_transformer: Any, *, group: Any = None, plan: Any = None, pv: str | None = None,
              backend: str = "auto") -> Any:
        from sagevideo.pipelines.wan.sequence_parallel import shard_wan

        return shard_wan(pipe_or_transformer, group=group, plan=plan, pv=pv, backend=backend)

    def degree_problem(self, source: ModelSource, job: JobSpec, degree: int) -> str | None:
        # Each rank keeps every text (and CLIP image) token: cross-attention keys are replicated,
        # not split, so only the video tokens must divide.
        video = video_tokens(source, job)
        if video % degree:
            return (f"{video} video tokens are not divisible by {degree} (the {source.text_tokens} text tokens "
                    "are not split: every rank keeps them); change frames/size or the degree")
        return None


def _need_safetensors(path: Path, component: str, where: str) -> None:
    if not any((path / component).glob("*.safetensors")):
        raise InputError(
            f"{where}: {component}/ has no .safetensors weights; sagevideo loads safetensors only "
            "(re-save with save_pretrained(..., safe_serialization=True))"
        )


def image_pipeline(pipe: Any) -> Any:
    """The pipeline that starts `pipe`'s video from an image: `pipe` itself when it is a
    WanImageToVideoPipeline; for a TI2V-5B WanPipeline (`expand_timesteps`), a
    WanImageToVideoPipeline over the very same components (as diffusers runs TI2V-5B's
    image-to-video): the same transformer modules, hence the same installed attention, and the
    same scheduler object, hence the same step clock."""
    from diffusers import WanImageToVideoPipeline

    if isinstance(pipe, WanImageToVideoPipeline):
        return pipe
    if not pipe.config.get("expand_timesteps"):
        raise TypeError(f"{type(pipe).__name__} without expand_timesteps makes video from text only")
    runner = WanImageToVideoPipeline(
        tokenizer=pipe.tokenizer, text_encoder=pipe.text_encoder, vae=pipe.vae, scheduler=pipe.scheduler,
        transformer=pipe.transformer, transformer_2=pipe.transformer_2,
        boundary_ratio=pipe.config.get("boundary_ratio"), expand_timesteps=True,
    )
    runner.set_progress_bar_config(disable=True)
    return runner


def encode_prompts(pipe: Any, job: JobSpec, text_tokens: int) -> dict[str, Any]:
    """prompt_embeds / negative_prompt_embeds for a WanImageToVideoPipeline call, as its own
    `encode_prompt` makes them from `prompt=` (the negative prompt "" when none is given, none
    without guidance), through WanPipeline's `_get_t5_prompt_embeds`: the same code line for line,
    except that diffusers 0.42's image-to-video copy calls ftfy even where ftfy is not installed
    (a NameError), where WanPipeline's calls it only where it is. Under no_grad, as inside the
    pipeline's call (embeddings that require grad would steer SDPA to other kernels)."""
    import torch
    from diffusers import WanPipeline

    @torch.no_grad()
    def embed(text: str) -> Any:
        return WanPipeline._get_t5_prompt_embeds(pipe, prompt=text, max_sequence_length=text_tokens,
                                                 device=pipe._execution_device)

    negative = embed(job.negative_prompt or "") if job.guidance > 1.0 else None
    return {"prompt_embeds": embed(job.prompt), "negative_prompt_embeds": negative}


def cast_as_loaded(module: Any, device: str, dtype: Any) -> None:
    """Move a built model to `device` and `dtype` as `from_pretrained(torch_dtype=dtype)` would
    have loaded it: the saved floating tensors (the state dict) in `dtype` except those under the
    model's keep-in-float32 modules (diffusers: `_keep_in_fp32_modules` always; transformers: for
    float16 only, `_keep_in_fp32_modules_strict` for float16 and bfloat16), other buffers (Wan's
    rotary tables) as they were built. torch's own `to`: diffusers' ModelMixin.to warns about
    fp32 modules on every cast."""
    import torch

    keep = set(getattr(module, "_keep_in_fp32_modules", None) or ())
    if hasattr(module, "_keep_in_fp32_modules_strict"):  # a transformers model
        strict = set(module._keep_in_fp32_modules_strict or ())
        keep = (keep if dtype == torch.float16 else set()) | (strict if dtype in (torch.float16, torch.bfloat16)
                                                              else set())
    saved = set(module.state_dict())
    torch.nn.Module.to(module, device=device)
    for name, tensor in [*module.named_parameters(), *module.named_buffers()]:
        if name in saved and tensor.is_floating_point():
            tensor.data = tensor.data.to(torch.float32 if keep & set(name.split(".")) else dtype)


def clean_prompt(text: str) -> str:
    """WanPipeline's `prompt_clean`: ftfy's fix_text where ftfy is installed (as diffusers does),
    HTML entities unescaped twice, whitespace collapsed."""
    try:
        import ftfy
    except ImportError:
        pass
    else:
        text = ftfy.fix_text(text)
    return re.sub(r"\s+", " ", html.unescape(html.unescape(text)).strip()).strip()


def _token_counter(source: ModelSource):
    """prompt -> umT5 tokens with </s> as the pipeline counts them (its tokenizer, local files only)."""
    return _counter(source.name if source.is_tiny else str(source.path), source.fingerprint)


@lru_cache(maxsize=4)
def _counter(model: str, fingerprint: str):
    if model in WanFamily.tiny_models:
        from sagevideo.pipelines.tiny import tiny_tokenizer

        tokenizer = tiny_tokenizer()
    else:
        from transformers import AutoTokenizer

        try:
            tokenizer = AutoTokenizer.from_pretrained(Path(model) / "tokenizer", local_files_only=True)
        except Exception as err:  # noqa: BLE001 - any failure means the folder's tokenizer is unusable
            raise InputError(f"--model {model}: tokenizer/ does not load ({type(err).__name__}: {err}); "
                             "copy the whole diffusers folder") from None
    return lambda text: len(tokenizer(clean_prompt(text), add_special_tokens=True).input_ids)


FAMILY = WanFamily()


def _latent_grid(transformer: Any, args: tuple, kwargs: dict) -> tuple[int, int, int] | None:
    """The video tokens' grid of a Wan forward: latents (B, C, F, H, W) over the (t, h, w) patch."""
    latents = forward_input(args, kwargs, "hidden_states")
    if latents is None or latents.dim() != 5:
        return None
    p_t, p_h, p_w = transformer.config.patch_size
    frames, height, width = latents.shape[2:]
    return frames // p_t, height // p_h, width // p_w
