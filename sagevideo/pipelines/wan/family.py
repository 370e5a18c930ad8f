"""The Wan family (diffusers `WanPipeline`: Wan 2.1 1.3B/14B, Wan 2.2 A14B text-to-video): what
generate, ab, calibrate and `--gpus-per-job` need to know of it. Registered in
`sagevideo.pipelines.families`.

- models: the built-in `tiny-wan` and `tiny-wan22` (`wan.tiny`) and local `WanPipeline` folders
  (Wan 2.2 A14B: `transformer_2` with the pipeline's `boundary_ratio`, both denoisers loaded);
- job constraints: height and width multiples of VAE x patch (8 x 2 = 16), frames 1 + 4k (the VAE
  compresses time 4x after the first frame), prompts of at most 512 umT5 tokens (the pipeline
  would cut the rest without a word), mp4s written at Wan's 16 fps;
- attention: diffusers' dispatcher (`WanAttnProcessor` -> SDPA), so `install` intercepts SDPA
  inside each denoiser's forward; layers `blocks.N.attn1` (self-attention over the video tokens)
  and `blocks.N.attn2` (cross-attention to the text), those of `transformer_2` prefixed
  `transformer_2.` as `install` names them;
- sequence parallelism: `sequence_parallel.shard_wan` (sagevideo's Ulysses around the
  interception: video tokens split, text replicated), degrees that divide the heads and the video
  tokens.
Nothing here imports torch or diffusers at import time.
"""

from __future__ import annotations

import html
import re
import warnings
from functools import lru_cache
from pathlib import Path
from typing import Any

from sagevideo.jobs.specs import InputError, JobSpec
from sagevideo.pipelines.families import ModelFamily, size_problems
from sagevideo.pipelines.loading import (
    ModelSource,
    fingerprint,
    folder_fingerprint,
    no_diffusers_progress_bars,
    read_json,
)

TRANSFORMER_CLASS = "WanTransformer3DModel"  # the one sagevideo splits (not VACE's or Animate's)
DENOISERS = ("transformer", "transformer_2")
# Components of a WanPipeline folder besides the denoisers (model_index.json names each).
COMPONENTS = ("tokenizer", "text_encoder", "vae", "scheduler")
TEXT_TOKENS = 512  # umT5's context in Wan; WanAttnProcessor assumes it for image-to-video too
FPS = 16  # the frame rate Wan is trained and released at
DEFAULT_HEIGHT, DEFAULT_WIDTH, DEFAULT_FRAMES = 480, 832, 81  # WanPipeline's defaults


def denoiser_configs(source: ModelSource) -> dict[str, dict[str, Any]]:
    """Component -> transformer config (JSON only) of every denoiser, `transformer` first."""
    if source.is_tiny:
        from sagevideo.pipelines.wan import tiny

        cfg = {"_class_name": TRANSFORMER_CLASS, **tiny.TRANSFORMER_CONFIG}
        return {name: cfg for name in DENOISERS[: 2 if tiny.TINY_MODELS[source.name] is not None else 1]}
    index = read_json(source.path / "model_index.json", f"--model {source.name}", "")
    return {
        name: read_json(source.path / name / "config.json", f"--model {source.name}", "")
        for name in DENOISERS
        if _listed(index.get(name))
    }


def _listed(entry: Any) -> bool:
    """Whether a model_index.json entry names a component (["diffusers", "Class"], not [null, null])."""
    return isinstance(entry, (list, tuple)) and len(entry) == 2 and all(isinstance(e, str) for e in entry)


def video_tokens(source: ModelSource, job: JobSpec) -> int:
    """Video tokens of one transformer call for a resolved job (latent frames x patches)."""
    latent_frames = (job.frames - 1) // source.temporal + 1
    size = source.spatial * source.patch
    return latent_frames * (job.height // size) * (job.width // size)


class WanFamily(ModelFamily):
    name = "wan"
    title = "Wan"
    pipeline_classes = ("WanPipeline",)
    tiny_models = ("tiny-wan", "tiny-wan22")
    weight_components = ("transformer", "vae", "text_encoder")  # transformer_2: checked when listed
    generates = True
    sequence_parallel = True

    # --- detection and loading ---

    def tiny_source(self, name: str) -> ModelSource:
        from sagevideo.pipelines.wan import tiny

        cfg, vae = tiny.TRANSFORMER_CONFIG, tiny.VAE_CONFIG
        return ModelSource(
            name=name,
            path=None,
            fingerprint=fingerprint(
                [name, cfg, vae, tiny.T5_CONFIG, tiny.SCHEDULER_CONFIG, tiny.TINY_MODELS[name], tiny.TINY_SEED,
                 tiny.DEFAULT_HEIGHT, tiny.DEFAULT_FRAMES]
            ),
            pipeline_class="WanPipeline",
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
            default_fps=FPS,
        )

    def folder_source(self, path: Path, index: dict[str, Any], model: str) -> ModelSource:
        where = f"--model {model}"
        missing = [name for name in (*COMPONENTS, "transformer") if not _listed(index.get(name))]
        if missing:
            raise InputError(
                f"{where}: model_index.json names no {', '.join(missing)}; a WanPipeline folder has tokenizer, "
                "text_encoder, vae, scheduler and transformer (and transformer_2 for Wan 2.2 A14B)"
            )
        for name in COMPONENTS:
            folder = path / name
            if not folder.is_dir() or not any(folder.iterdir()):
                raise InputError(f"{where}: the {name}/ folder is missing or empty in {path}; model_index.json "
                                 "names it (copy the whole diffusers folder)")
        configs = {}
        for name in DENOISERS:
            if not _listed(index.get(name)):
                continue
            if not any((path / name).glob("*.safetensors")):
                raise InputError(
                    f"{where}: {name}/ has no .safetensors weights; sagevideo loads safetensors only "
                    "(re-save with save_pretrained(..., safe_serialization=True))"
                )
            configs[name] = read_json(path / name / "config.json", where, f"the {name}/ folder is incomplete")
        two = "transformer_2" in configs
        if two != (index.get("boundary_ratio") is not None):
            raise InputError(
                f"{where}: model_index.json has "
                + ("transformer_2 but no boundary_ratio (WanPipeline would never run it)" if two
                   else f"boundary_ratio {index.get('boundary_ratio')} but no transformer_2")
                + "; Wan 2.2 A14B folders have both, Wan 2.1 folders neither"
            )
        cfg = configs["transformer"]
        for name, other in configs.items():
            if other.get("_class_name", TRANSFORMER_CLASS) != TRANSFORMER_CLASS:
                raise InputError(f"{where}: {name}/config.json is a {other.get('_class_name')}; sagevideo generate "
                                 f"runs WanPipeline folders with {TRANSFORMER_CLASS} denoisers")
            shape = [other.get(k) for k in ("num_attention_heads", "attention_head_dim", "patch_size")]
            if shape != [cfg.get(k) for k in ("num_attention_heads", "attention_head_dim", "patch_size")]:
                raise InputError(f"{where}: transformer_2's heads, head dim or patch size differ from transformer's")
        vae = read_json(path / "vae" / "config.json", where, "the vae/ folder is incomplete")
        patch = cfg.get("patch_size", (1, 2, 2))
        if len(patch) != 3 or patch[0] != 1 or patch[1] != patch[2]:
            raise InputError(f"{where}: transformer patch size {patch} is not (1, p, p) as in every Wan release")
        return ModelSource(
            name=str(path),
            path=path,
            fingerprint=folder_fingerprint(path),
            pipeline_class=index["_class_name"],
            heads=cfg.get("num_attention_heads", 40),
            head_dim=cfg.get("attention_head_dim", 128),
            spatial=vae.get("scale_factor_spatial") or 2 ** (len(vae.get("dim_mult", (1, 2, 4, 4))) - 1),
            temporal=vae.get("scale_factor_temporal") or 2 ** sum(map(bool, vae.get("temperal_downsample",
                                                                                    (False, True, True)))),
            patch=patch[1],
            text_tokens=TEXT_TOKENS,
            default_height=DEFAULT_HEIGHT,
            default_width=DEFAULT_WIDTH,
            default_frames=DEFAULT_FRAMES,
            default_steps=50,
            layers=cfg.get("num_layers", 40),
            vae_channels=vae.get("decoder_base_dim") or vae.get("base_dim", 96),
            family=self.name,
            default_fps=FPS,
        )

    def load(self, source: ModelSource, device: str, dtype: Any) -> Any:
        import torch

        if source.is_tiny:
            from sagevideo.pipelines.wan.tiny import tiny_pipeline

            pipe = tiny_pipeline(source.name)
            for module in (pipe.transformer, pipe.transformer_2, pipe.text_encoder):
                if module is not None:
                    _to_dtype(module, device, dtype)
            torch.nn.Module.to(pipe.vae, device=device, dtype=torch.float32)  # as from_pretrained below
            return pipe
        from diffusers import AutoencoderKLWan, WanPipeline

        with warnings.catch_warnings(), no_diffusers_progress_bars():
            warnings.filterwarnings("ignore", message=".*torch_dtype.*deprecated", category=FutureWarning)
            # The VAE in float32, as Wan's own examples load it (its decoder is sensitive in bf16).
            vae = AutoencoderKLWan.from_pretrained(
                source.path, subfolder="vae", local_files_only=True, use_safetensors=True, torch_dtype=torch.float32
            )
            pipe = WanPipeline.from_pretrained(
                source.path, vae=vae, local_files_only=True, use_safetensors=True, torch_dtype=dtype
            )
        pipe.to(device)
        return pipe

    # --- job constraints ---

    def job_problems(self, source: ModelSource, job: JobSpec) -> list[str]:
        problems = size_problems(source, job)
        temporal = source.temporal
        if (job.frames - 1) % temporal:
            near = (job.frames - 1) // temporal * temporal + 1
            problems.append(
                f"frames: {job.frames} is not 1 + a multiple of {temporal} (the VAE compresses time {temporal}x "
                f"after the first frame); use e.g. {near} or {near + temporal}"
            )
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

    # --- generation ---

    def denoise(self, pipe: Any, job: JobSpec, *, generator: Any, text_tokens: int, callback: Any) -> Any:
        (latents,) = pipe(
            prompt=job.prompt,
            negative_prompt=job.negative_prompt or None,
            height=job.height,
            width=job.width,
            num_frames=job.frames,
            num_inference_steps=job.steps,
            guidance_scale=job.guidance,
            generator=generator,
            output_type="latent",
            return_dict=False,
            callback_on_step_end=callback,
            callback_on_step_end_tensor_inputs=["latents"],
            max_sequence_length=text_tokens,
        )
        return latents

    def decode(self, pipe: Any, job: JobSpec, latents: Any) -> Any:
        """As WanPipeline's own decode: latents un-normalized with the VAE's per-channel statistics."""
        import torch

        vae = pipe.vae
        latents = latents.to(next(vae.parameters()).device, vae.dtype)
        shape = (1, vae.config.z_dim, 1, 1, 1)
        mean = torch.tensor(vae.config.latents_mean).view(shape).to(latents)
        std = torch.tensor(vae.config.latents_std).view(shape).to(latents)
        return vae.decode(latents * std + mean, return_dict=False)[0]  # (1, 3, F, H, W) in [-1, 1]

    # --- sequence parallelism ---

    def shardable(self, source: ModelSource) -> str | None:
        classes = {cfg.get("_class_name", TRANSFORMER_CLASS) for cfg in denoiser_configs(source).values()}
        if source.pipeline_class in self.pipeline_classes and classes == {TRANSFORMER_CLASS}:
            return None
        return f"{source.pipeline_class} with a {', '.join(sorted(classes))}"

    def shard(self, pipe_or_transformer: Any, *, group: Any = None, plan: Any = None, pv: str | None = None,
              backend: str = "auto") -> Any:
        from sagevideo.pipelines.wan.sequence_parallel import shard_wan

        return shard_wan(pipe_or_transformer, group=group, plan=plan, pv=pv, backend=backend)

    def degree_problem(self, source: ModelSource, job: JobSpec, degree: int) -> str | None:
        # The text is replicated on every rank (cross-attention keys), so only the video tokens split.
        video = video_tokens(source, job)
        if video % degree:
            return f"{video} video tokens are not divisible by {degree}; change frames/size or the degree"
        return None


def _to_dtype(module: Any, device: str, dtype: Any) -> None:
    """torch's own `to` (diffusers' ModelMixin.to warns about fp32 modules on every cast), keeping
    the modules a model lists in `_keep_in_fp32_modules` in float32, as from_pretrained does, and
    the rotary tables (non-persistent buffers) as they were built."""
    import torch

    rope = getattr(module, "rope", None)
    tables = (rope.freqs_cos, rope.freqs_sin) if hasattr(rope, "freqs_cos") else None
    torch.nn.Module.to(module, device=device, dtype=dtype)
    keep = getattr(module, "_keep_in_fp32_modules", None) or []
    if dtype != torch.float32:
        for name, sub in module.named_modules():
            if name and any(k in name.split(".") for k in keep):
                torch.nn.Module.to(sub, dtype=torch.float32)
    if tables is not None:
        rope.freqs_cos, rope.freqs_sin = (t.to(device) for t in tables)


def clean_prompt(text: str) -> str:
    """WanPipeline's `prompt_clean` without ftfy: HTML entities unescaped, whitespace collapsed."""
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
