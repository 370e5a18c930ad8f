"""CLIPSIM and CLIP-T with CLIP ViT-B/32 from a local folder (transformers), plain cosine scale.

- CLIPSIM: mean over frames of cos(frame embedding, prompt embedding), as the video papers
  report it (plain cosine in [-1, 1]; torchmetrics' CLIPScore would report 100·max(cos, 0)).
- CLIP-T: mean over consecutive frame pairs of cos(frame_i, frame_i+1) (temporal consistency).

Preprocessing is the model's own `CLIPProcessor` (bicubic resize of the short side, center
crop, CLIP mean/std) applied to uint8 RGB frames. CLIP's text encoder takes 77 tokens: longer
prompts are truncated to fit, and every one is reported (`token_reports`), never silently.

Written here rather than taken from torchmetrics: CLIPScore does not accept a plain local
folder and clips/scales the cosine; there is no CLIP-T. The model is injectable: `CLIPEmbedder`
takes a loaded (model, processor), `load_clip(folder)` is the real local-path loader.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from sagevideo.eval.frame_metrics import PerVideoMetric

BATCH = 32


def _embeds(output: Any) -> torch.Tensor:
    """get_*_features returns a tensor (transformers 4) or an output with pooler_output (5)."""
    return output if isinstance(output, torch.Tensor) else output.pooler_output


class CLIPEmbedder:
    """Unit-norm CLIP image and text embeddings from a loaded model and processor."""

    def __init__(self, model: Any, processor: Any, *, device: str | torch.device = "cpu", source: str = "injected"):
        self.model = model.eval().to(device)
        self.processor = processor
        self.device = torch.device(device)
        self.source = source
        self.max_tokens = int(model.config.text_config.max_position_embeddings)
        # (frames, features) of the last video: CLIPSIM and CLIP-T of one video embed its frames once
        self._last: tuple[np.ndarray, torch.Tensor] | None = None

    @torch.no_grad()
    def image_features(self, frames: np.ndarray) -> torch.Tensor:
        """(F, H, W, 3) uint8 -> (F, d) unit-norm float64 (on CPU)."""
        if self._last is not None and self._last[0] is frames:
            return self._last[1]
        out = []
        for start in range(0, len(frames), BATCH):
            batch = [np.asarray(f) for f in frames[start : start + BATCH]]
            pixels = self.processor(images=batch, return_tensors="pt")["pixel_values"].to(self.device)
            feats = _embeds(self.model.get_image_features(pixel_values=pixels.to(self.model.dtype)))
            out.append(torch.nn.functional.normalize(feats.double(), dim=-1).cpu())
        features = torch.cat(out)
        self._last = (frames, features)
        return features

    def token_count(self, prompt: str) -> int:
        """Tokens of the prompt including start/end tokens, without truncation."""
        return len(self.processor.tokenizer(prompt, truncation=False)["input_ids"])

    @torch.no_grad()
    def text_features(self, prompt: str) -> torch.Tensor:
        """(d,) unit-norm float64; prompts over `max_tokens` are truncated (callers report it)."""
        tokens = self.processor.tokenizer(
            [prompt], padding="max_length", truncation=True, max_length=self.max_tokens, return_tensors="pt"
        )
        feats = _embeds(
            self.model.get_text_features(
                input_ids=tokens["input_ids"].to(self.device), attention_mask=tokens["attention_mask"].to(self.device)
            )
        )
        return torch.nn.functional.normalize(feats.double(), dim=-1)[0].cpu()

    def describe(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "model": type(self.model).__name__,
            "max_tokens": self.max_tokens,
            "preprocessing": "the model's CLIPProcessor: resize short side (bicubic), center crop, CLIP mean/std",
            "scale": "plain cosine in [-1, 1]",
        }


def load_clip(folder: str | Path, *, device: str | torch.device = "cpu") -> CLIPEmbedder:
    """Load CLIP from a local Hugging Face folder (local files only, nothing downloaded)."""
    import transformers
    from transformers import CLIPModel, CLIPProcessor

    folder = Path(folder)
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()  # e.g. "CLIPImageProcessor requires torchvision, using the PIL one"
    try:
        model = CLIPModel.from_pretrained(folder, local_files_only=True)
        processor = CLIPProcessor.from_pretrained(folder, local_files_only=True)
    finally:
        transformers.logging.set_verbosity(verbosity)
    return CLIPEmbedder(model, processor, device=device, source=str(folder))


class CLIPSIM(PerVideoMetric):
    """Per-video mean frame–prompt cosine. `token_reports`: prompts longer than CLIP's limit."""

    higher_is_better = True

    def __init__(self, embedder: CLIPEmbedder, **kwargs):
        super().__init__(**kwargs)
        self.embedder = embedder
        self.token_reports: dict[str, int] = {}

    def update(self, frames: np.ndarray, prompt: str) -> None:
        """frames: (F, H, W, 3) uint8 RGB; prompt: the video's prompt."""
        tokens = self.embedder.token_count(prompt)
        if tokens > self.embedder.max_tokens:
            self.token_reports[prompt] = tokens
        image = self.embedder.image_features(frames)
        text = self.embedder.text_features(prompt)
        self.values.append((image @ text).mean().reshape(1))


class CLIPTemporal(PerVideoMetric):
    """CLIP-T: per-video mean cosine of consecutive frames' CLIP embeddings (NaN for one frame)."""

    higher_is_better = True

    def __init__(self, embedder: CLIPEmbedder, **kwargs):
        super().__init__(**kwargs)
        self.embedder = embedder

    def update(self, frames: np.ndarray) -> None:
        image = self.embedder.image_features(frames)
        if image.shape[0] < 2:
            value = torch.tensor([float("nan")], dtype=torch.float64)
        else:
            value = (image[1:] * image[:-1]).sum(-1).mean().reshape(1)
        self.values.append(value)
