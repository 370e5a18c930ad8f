"""Open-Sora 2.0 text-to-video and image-to-video, assembled from diffusers/transformers parts.

- VAE: diffusers' `AutoencoderKLHunyuanVideo` (16 latent channels, 8x space, 4x time with the
  first frame on its own; latents are z * 0.476986 with shift 0: `vae.config.scaling_factor`).
- Text: T5-v1.1-XXL `last_hidden_state` of the prompt padded to 512 tokens, run WITHOUT an
  attention mask (as the official model; the padding tokens are attended to), and CLIP-L/14's
  `pooler_output` at 77 tokens. The prompt is prepared as the official sampler does
  (`add_prompt_suffixes`): stripped, ended with a period, " {fps} FPS." appended unless it
  already ends in "N FPS.", then " {motion_score} motion score.", before both encoders. The
  negative prompt gets no suffix (the official sampler suffixes its `text` only; default "").
- Sampling: Euler steps on the shifted linspace schedule (`schedule.opensora_sigmas`) through a
  `FlowMatchEulerDiscreteScheduler` left at shift 1 (the shift is applied here), velocity output.
- Guidance: each step runs the transformer on [prompt + cond, negative + cond, negative + zero
  cond] and combines u2 + g_img * (u - u2) + g_txt * (c - u), with the official configs'
  oscillation of both scales by default (`schedule.oscillated_scale`: 1.0 on odd steps from step 10).
- Image-to-video (`image=`, the official `cond_type="i2v_head"`): the image is resized to cover
  the video and center-cropped (`resize_crop_to_fill`, bicubic), encoded by the VAE as one frame
  (a sample of the posterior, drawn from the generator after the noise, as the official encode
  samples), and becomes `cond` = pack(cat(mask, masked reference)) with mask 1 and the reference
  latent in latent frame 0, zeros elsewhere (`image_condition`). g_img is scaled over time as
  the official `scale_temporal_osci` (`schedule.temporal_image_scale`: from 1 at the first latent
  frame to a bound that falls from g_img to 1 over the steps), and after the last step latent
  frame 0 is replaced by the reference latent, as the official sampler does before decoding.
  Text-to-video: cond is zero in every branch (the `cond_in` bias still applies), so u == u2.
- Per step, diffusers' `callback_on_step_end(pipeline, step, timestep, tensors)` with the tensors
  named in `callback_on_step_end_tensor_inputs` ("latents"); the latents it returns go on.
- Decoding (`decode_latents`): the official configs' spatial tiling (256 px tiles, a quarter
  overlap: diffusers' `enable_tiling()` defaults are the same) and no temporal tiling
  (`configure_vae`; diffusers decodes frame-wise by default, the official sampler does not).

Rounding (not the function) differs from the official bf16 sampler: the Euler state and the
guidance combination stay fp32 here (the official keeps them in the model dtype).
Not ported: the other official condition types (i2v_tail, i2v_loop, v2v_*) and the t2i2v mode
with FLUX.1-dev. The aspect-ratio table is `aspect.py` (height and width are given here, as
multiples of 16; the product checks them against the table).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from diffusers import AutoencoderKLHunyuanVideo, FlowMatchEulerDiscreteScheduler
from diffusers.callbacks import MultiPipelineCallbacks, PipelineCallback
from diffusers.pipelines.pipeline_utils import DiffusionPipeline
from diffusers.utils import BaseOutput
from diffusers.utils.torch_utils import randn_tensor
from diffusers.video_processor import VideoProcessor

from sagevideo.pipelines.opensora.packing import latent_ids, pack_condition, pack_latents, text_ids, unpack_latents
from sagevideo.pipelines.opensora.prompts import add_prompt_suffixes
from sagevideo.pipelines.opensora.schedule import (
    combine_guidance,
    opensora_sigmas,
    oscillated_scale,
    temporal_image_scale,
)
from sagevideo.pipelines.opensora.transformer import OpenSoraTransformer3DModel

T5_MAX_LENGTH = 512
CLIP_MAX_LENGTH = 77
LATENT_SHIFT = 0.0  # the official VAE config: scale 0.476986 (vae.config.scaling_factor), shift 0

Scale = float | Callable[[int, float], float]
# An input image: PIL, (H, W, 3) uint8 array, or (3, H, W) float tensor in [-1, 1].
ImageInput = Any


@dataclass
class OpenSoraPipelineOutput(BaseOutput):
    """frames: np.ndarray (B, F, H, W, 3) in [0, 1] ("np"), list of lists of PIL images ("pil"),
    a tensor (B, F, 3, H, W) ("pt"), or the latents (B, 16, T_lat, H/8, W/8) ("latent")."""

    frames: torch.Tensor | np.ndarray | list


class OpenSoraPipeline(DiffusionPipeline):
    """Text-to-video, and image-to-video from a first frame, with the Open-Sora 2.0 transformer
    (see the module docstring for what is and is not the official sampler).

    tokenizer/text_encoder: T5 (`T5EncoderModel`); tokenizer_2/text_encoder_2: CLIP (`CLIPTextModel`).
    """

    model_cpu_offload_seq = "text_encoder->text_encoder_2->transformer->vae"
    _callback_tensor_inputs = ["latents"]

    def __init__(
        self,
        tokenizer,
        text_encoder,
        tokenizer_2,
        text_encoder_2,
        vae: AutoencoderKLHunyuanVideo,
        transformer: OpenSoraTransformer3DModel,
        scheduler: FlowMatchEulerDiscreteScheduler,
    ):
        super().__init__()
        self.register_modules(
            tokenizer=tokenizer, text_encoder=text_encoder, tokenizer_2=tokenizer_2, text_encoder_2=text_encoder_2,
            vae=vae, transformer=transformer, scheduler=scheduler,
        )
        self.vae_scale_factor_spatial = vae.config.spatial_compression_ratio
        self.vae_scale_factor_temporal = vae.config.temporal_compression_ratio
        self.video_processor = VideoProcessor(vae_scale_factor=self.vae_scale_factor_spatial)
        configure_vae(vae)

    @torch.no_grad()
    def encode_prompt(
        self, prompts: list[str], device: torch.device, max_sequence_length: int = T5_MAX_LENGTH
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(T5 states (B, max_sequence_length, d_t5), CLIP pooled (B, d_clip)), encoders' dtypes."""
        t5_ids = self.tokenizer(
            prompts, padding="max_length", max_length=max_sequence_length, truncation=True, return_tensors="pt"
        ).input_ids
        # No attention mask, as the official model: the pad tokens' states are part of the context.
        t5 = self.text_encoder(input_ids=t5_ids.to(device)).last_hidden_state
        clip_ids = self.tokenizer_2(
            prompts, padding="max_length", max_length=CLIP_MAX_LENGTH, truncation=True, return_tensors="pt"
        ).input_ids
        pooled = self.text_encoder_2(input_ids=clip_ids.to(device)).pooler_output
        return t5, pooled

    def _check_scheduler(self) -> None:
        cfg = self.scheduler.config
        if not isinstance(self.scheduler, FlowMatchEulerDiscreteScheduler) or cfg.shift != 1.0 or any(
            cfg.get(flag) for flag in ("use_dynamic_shifting", "use_karras_sigmas", "use_exponential_sigmas",
                                       "use_beta_sigmas", "shift_terminal", "invert_sigmas")
        ):
            raise ValueError(
                "OpenSoraPipeline applies Open-Sora's own shift; give it FlowMatchEulerDiscreteScheduler() with "
                f"the default config (shift=1, no dynamic/karras/terminal options), got {self.scheduler.config}"
            )

    @torch.no_grad()
    def __call__(
        self,
        prompt: str | list[str],
        negative_prompt: str | list[str] | None = None,
        image: ImageInput | list[ImageInput] | None = None,
        height: int = 192,
        width: int = 336,
        num_frames: int = 129,
        num_inference_steps: int = 50,
        guidance_scale: Scale = 7.5,
        image_guidance_scale: Scale = 3.0,
        text_oscillation: bool = True,
        image_oscillation: bool = True,
        image_temporal_scaling: bool = True,
        fps: int | None = 24,
        motion_score: int | None = 4,
        num_videos_per_prompt: int = 1,
        generator: torch.Generator | list[torch.Generator] | None = None,
        latents: torch.Tensor | None = None,
        max_sequence_length: int = T5_MAX_LENGTH,
        output_type: str = "np",
        return_dict: bool = True,
        callback_on_step_end: Callable[..., dict] | PipelineCallback | MultiPipelineCallbacks | None = None,
        callback_on_step_end_tensor_inputs: list[str] | None = None,
    ) -> OpenSoraPipelineOutput | tuple:
        """Generate videos (default: 256px 16:9, 129 frames, 50 steps, g_txt 7.5, g_img 3.0, both oscillating).

        image: the first frame to start from (image-to-video), one for all prompts or one per prompt:
        a PIL image, an (H, W, 3) uint8 array or a (3, H, W) tensor in [-1, 1]; resized to cover
        height x width and center-cropped (`resize_crop_to_fill`). None: text-to-video.
        height, width: pixels, multiples of 16 (VAE 8x times patch 2); num_frames: 1 + a multiple of 4.
        guidance_scale (g_txt), image_guidance_scale (g_img): a float, or a callable
        (step_index, sigma) -> float for a step-dependent schedule.
        text_oscillation, image_oscillation: the official configs' `text_osci`/`image_osci` (on by
        default): that scale is 1.0 on odd steps from step 10 on (`schedule.oscillated_scale`).
        image_temporal_scaling: the official `scale_temporal_osci` of g_img with an image (on by
        default; `schedule.temporal_image_scale`); without an image g_img has no effect.
        fps, motion_score: the prompt suffixes (`add_prompt_suffixes`); None leaves that one out.
        latents: optional initial noise (B, 16, T_lat, H/8, W/8), B = len(prompts) * num_videos_per_prompt.
        callback_on_step_end: diffusers' per-step callback, called as (pipeline, step index, timestep,
        {name: tensor}) after each Euler step with the tensors named in
        callback_on_step_end_tensor_inputs (default ["latents"]; the only one there is); a "latents"
        entry in the dict it returns replaces the latents.
        """
        self._check_scheduler()
        tensor_inputs = self._tensor_inputs(callback_on_step_end, callback_on_step_end_tensor_inputs)
        self._check_size(height, width, num_frames)
        patch = self.transformer.config.patch_size
        prompts = [prompt] if isinstance(prompt, str) else list(prompt)
        negatives = negative_prompt if negative_prompt is not None else ""
        negatives = [negatives] * len(prompts) if isinstance(negatives, str) else list(negatives)
        if len(negatives) != len(prompts):
            raise ValueError(f"{len(negatives)} negative prompts for {len(prompts)} prompts")
        images = None if image is None else self._batch_images(image, len(prompts), num_videos_per_prompt)
        prompts = [add_prompt_suffixes(p, fps, motion_score) for p in prompts for _ in range(num_videos_per_prompt)]
        negatives = [n for n in negatives for _ in range(num_videos_per_prompt)]
        batch = len(prompts)
        device = self._execution_device
        dtype = self.transformer.dtype

        txt, pooled = self.encode_prompt(prompts, device, max_sequence_length)
        neg_txt, neg_pooled = self.encode_prompt(negatives, device, max_sequence_length)
        # Branches: c = prompt + cond, u = negative + cond, u2 = negative + zero cond.
        txt3 = torch.cat([txt, neg_txt, neg_txt]).to(dtype)
        pooled3 = torch.cat([pooled, neg_pooled, neg_pooled]).to(dtype)

        t_lat = (num_frames - 1) // self.vae_scale_factor_temporal + 1
        h_lat, w_lat = height // self.vae_scale_factor_spatial, width // self.vae_scale_factor_spatial
        shape = (batch, self.vae.config.latent_channels, t_lat, h_lat, w_lat)
        if latents is None:
            latents = randn_tensor(shape, generator=generator, device=device, dtype=torch.float32)
        elif tuple(latents.shape) != shape:
            raise ValueError(f"latents have shape {tuple(latents.shape)}, expected {shape}")
        latents = latents.to(device=device, dtype=torch.float32)  # the Euler state stays fp32

        img_ids = latent_ids(3 * batch, t_lat, h_lat, w_lat, patch, dtype=dtype, device=device)
        txt_ids = text_ids(3 * batch, txt3.shape[1], dtype=dtype, device=device)
        reference = None
        if images is None:  # text-to-video: mask and reference latent are zero in all three branches
            cond = torch.zeros(3 * batch, img_ids.shape[1], self.transformer.config.cond_in_channels,
                               dtype=dtype, device=device)
        else:
            reference = self.encode_reference(images, height, width, generator)  # (B, 16, 1, h, w) fp32
            first = image_condition(reference, t_lat, patch).to(dtype)
            cond = torch.cat([first, first, torch.zeros_like(first)])

        tokens_per_frame = (h_lat // patch) * (w_lat // patch)
        sigmas = opensora_sigmas(num_inference_steps, tokens_per_frame, t_lat)
        self.scheduler.set_timesteps(sigmas=sigmas[:-1].tolist(), device=device)
        with self.progress_bar(total=num_inference_steps) as progress:
            for i, t in enumerate(self.scheduler.timesteps):
                sigma = self.scheduler.sigmas[i]
                img = pack_latents(latents, patch).to(dtype).repeat(3, 1, 1)
                # The three guidance branches are one batched forward: one cache context (a
                # step cache's state lives in it; diffusers' pipelines name theirs likewise).
                with self.transformer.cache_context("cond"):
                    pred = self.transformer(
                        img, img_ids, txt3, txt_ids, sigma.expand(3 * batch).to(dtype), pooled3, cond=cond
                    )
                c, u, u2 = pred.float().chunk(3)
                g_txt, g_img = _step_scales(
                    guidance_scale, image_guidance_scale, i, float(sigma), text_oscillation=text_oscillation,
                    image_oscillation=image_oscillation,
                    image_frames=(num_inference_steps, t_lat, tokens_per_frame, device)
                    if reference is not None and image_temporal_scaling else None,
                )
                velocity = combine_guidance(c, u, u2, g_txt, g_img)
                velocity = unpack_latents(velocity, t_lat, h_lat, w_lat, patch)
                latents = self.scheduler.step(velocity, t, latents, return_dict=False)[0]
                if callback_on_step_end is not None:
                    local = {"latents": latents}
                    outputs = callback_on_step_end(self, i, t, {name: local[name] for name in tensor_inputs})
                    latents = outputs.pop("latents", latents)
                progress.update()
        if reference is not None:
            # The official sampler puts the reference latent back as latent frame 0 before decoding.
            latents = latents.clone()
            latents[:, :, :1] = reference

        if output_type == "latent":
            video = latents
        else:
            video = self.video_processor.postprocess_video(self.decode_latents(latents), output_type=output_type)
        self.maybe_free_model_hooks()
        return OpenSoraPipelineOutput(frames=video) if return_dict else (video,)

    def _tensor_inputs(self, callback: Any, names: list[str] | None) -> list[str]:
        """The tensors `callback_on_step_end` is given (a diffusers callback object names its own);
        ValueError for a name that is not a tensor of this pipeline."""
        if isinstance(callback, (PipelineCallback, MultiPipelineCallbacks)):
            names = callback.tensor_inputs
        tensor_inputs = list(names or ["latents"])
        unknown = [name for name in tensor_inputs if name not in self._callback_tensor_inputs]
        if unknown:
            raise ValueError(
                f"callback_on_step_end_tensor_inputs {unknown} are not tensors of this pipeline; "
                f"use some of {self._callback_tensor_inputs}"
            )
        return tensor_inputs

    def _check_size(self, height: int, width: int, num_frames: int) -> None:
        """ValueError unless the VAE and the patch size divide the video's size and frame count."""
        multiple = self.vae_scale_factor_spatial * self.transformer.config.patch_size
        if height % multiple or width % multiple:
            raise ValueError(f"height {height} and width {width} must be multiples of {multiple}")
        if (num_frames - 1) % self.vae_scale_factor_temporal:
            raise ValueError(f"num_frames {num_frames} must be 1 + a multiple of {self.vae_scale_factor_temporal}")

    @torch.no_grad()
    def decode_latents(self, latents: torch.Tensor) -> torch.Tensor:
        """Latents (B, 16, T_lat, H/8, W/8) -> video (B, 3, 1 + 4 (T_lat - 1), H, W) in [-1, 1], the VAE's dtype
        (not clamped: NaN/Inf stay visible). z = latents / scaling_factor + shift, as the official decode."""
        z = latents.to(self.vae.dtype) / self.vae.config.scaling_factor + LATENT_SHIFT
        return self.vae.decode(z, return_dict=False)[0]

    @torch.no_grad()
    def encode_reference(self, images: list[ImageInput], height: int, width: int,
                         generator: torch.Generator | list[torch.Generator] | None = None) -> torch.Tensor:
        """First frames -> reference latents (B, 16, 1, H/8, W/8) fp32, scaled as the official encode:
        scaling_factor * (posterior sample - shift). Each image is resized to cover height x width
        and center-cropped (`resize_crop_to_fill`), then encoded as a one-frame video."""
        device = self._execution_device
        pixels = torch.stack([reference_pixels(picture, height, width) for picture in images])  # (B, 3, H, W)
        pixels = pixels[:, :, None].to(device=device, dtype=self.vae.dtype)  # (B, 3, 1, H, W) in [-1, 1]
        posterior = self.vae.encode(pixels).latent_dist
        z = posterior.sample(generator=generator)
        return ((z.float() - LATENT_SHIFT) * self.vae.config.scaling_factor).float()

    @staticmethod
    def _batch_images(image: ImageInput | list[ImageInput], prompts: int, per_prompt: int) -> list[ImageInput]:
        """One image per video: one for every prompt, or one per prompt, repeated per video."""
        images = list(image) if isinstance(image, (list, tuple)) else [image] * prompts
        if len(images) != prompts:
            raise ValueError(f"{len(images)} images for {prompts} prompts; give one image, or one per prompt")
        return [picture for picture in images for _ in range(per_prompt)]


def resize_crop_to_fill(picture: Any, height: int, width: int) -> Any:
    """A PIL image resized (bicubic) so that it covers width x height, then center-cropped to it:
    the official sampler's "resize_crop" of reference images. An image of that size comes back unchanged."""
    from PIL import Image

    w, h = picture.size
    rh, rw = height / h, width / w
    if rh > rw:  # height decides: scale to the height, crop the width
        sh, sw = height, round(w * rh)
        top, left = 0, int(round((sw - width) / 2.0))
    else:
        sh, sw = round(h * rw), width
        top, left = int(round((sh - height) / 2.0)), 0
    resized = picture.resize((sw, sh), Image.Resampling.BICUBIC)
    return resized.crop((left, top, left + width, top + height))


def reference_pixels(picture: ImageInput, height: int, width: int) -> torch.Tensor:
    """An input image -> (3, height, width) fp32 in [-1, 1]. PIL images and (H, W, 3) uint8 arrays
    go through `resize_crop_to_fill`; a (3, H, W) tensor must be in [-1, 1] at that size already."""
    if isinstance(picture, torch.Tensor):
        if tuple(picture.shape) != (3, height, width):
            raise ValueError(f"image tensor has shape {tuple(picture.shape)}, expected (3, {height}, {width})")
        return picture.float()
    from PIL import Image

    if isinstance(picture, np.ndarray):
        picture = Image.fromarray(picture)
    picture = resize_crop_to_fill(picture.convert("RGB"), height, width)
    pixels = torch.from_numpy(np.asarray(picture, dtype=np.uint8).copy()).permute(2, 0, 1).float()
    return pixels / 127.5 - 1.0  # ToTensor then Normalize(0.5, 0.5), as the official transform


def image_condition(reference: torch.Tensor, latent_frames: int, patch_size: int = 2) -> torch.Tensor:
    """The packed `cond` of image-to-video from the first frame (official "i2v_head"): mask 1 and the
    reference latent in latent frame 0, zeros in the other frames. reference: (B, C, 1, h, w) ->
    (B, latent_frames * h/p * w/p, (1 + C) * p * p)."""
    b, c, _, h, w = reference.shape
    mask = reference.new_zeros(b, 1, latent_frames, h, w)
    masked = reference.new_zeros(b, c, latent_frames, h, w)
    mask[:, :, 0] = 1
    masked[:, :, 0] = reference[:, :, 0]
    return pack_condition(mask, masked, patch_size)


def configure_vae(vae: Any) -> None:
    """Decode as the official 256px/768px configs do: spatial tiling on (256 px tiles, stride 192: the
    official tile size and overlap factor 0.25), temporal tiling off (diffusers' frame-wise decoding
    and encoding are on by default)."""
    vae.enable_tiling()
    vae.use_framewise_decoding = False
    vae.use_framewise_encoding = False


def _step_scales(
    guidance_scale: Scale, image_guidance_scale: Scale, step: int, sigma: float, *, text_oscillation: bool,
    image_oscillation: bool, image_frames: tuple[int, int, int, torch.device] | None,
) -> tuple[float, Any]:
    """(g_txt, g_img) at `step`: each scale (or schedule) at that step, oscillated where asked; with
    `image_frames` (num_steps, t_lat, tokens_per_frame, device: an image given and temporal scaling
    on) a g_img above 1 becomes per latent frame, (1, L, 1) over the packed tokens."""
    g_txt, g_img = _scale(guidance_scale, step, sigma), _scale(image_guidance_scale, step, sigma)
    if text_oscillation:
        g_txt = oscillated_scale(g_txt, step)
    if image_oscillation:
        g_img = oscillated_scale(g_img, step)
    if image_frames is not None and g_img > 1.0:
        num_steps, t_lat, tokens_per_frame, device = image_frames
        per_frame = temporal_image_scale(g_img, step, num_steps, t_lat).to(device)
        g_img = per_frame.repeat_interleave(tokens_per_frame)[None, :, None]  # (1, L, 1)
    return g_txt, g_img


def _scale(scale: Scale, step: int, sigma: float) -> float:
    return float(scale(step, sigma)) if callable(scale) else float(scale)
