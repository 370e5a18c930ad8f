"""The HunyuanVideo 1.5 family (diffusers `HunyuanVideo15Pipeline`, `HunyuanVideo15ImageToVideoPipeline`,
`HunyuanVideo15Transformer3DModel`). Registered in `sagevideo.pipelines.families` for `install`:
sagevideo does not load, generate or split it (generate refuses its folders, saying so).

- attention: diffusers' dispatcher (`HunyuanVideo15AttnProcessor2_0` in the dual-stream blocks,
  `AttnProcessor2_0` in the token refiner), so `install` intercepts SDPA inside the transformer;
- masks: every layer masks the padded text. Its processors give SDPA `m & m.T` of one padding mask m
  over the sequence (video tokens valid, then the text): (B, 1, N, N) in the blocks, (B, H, T, T)
  in the token refiner, i.e. a query mask times a key mask. The kernels take the key mask and the
  padded queries' rows are set to 0, which is what SDPA gives a row with no key
  (`key_padding_layers`, `pipelines.masks`; each mask is checked before it is read so).
Nothing here imports torch or diffusers at import time.
"""

from __future__ import annotations

from typing import Any

from sagevideo.pipelines.families import ModelFamily

TRANSFORMER_CLASS = "HunyuanVideo15Transformer3DModel"


class HunyuanVideo15Family(ModelFamily):
    name = "hunyuanvideo15"
    title = "HunyuanVideo 1.5"
    pipeline_classes = ("HunyuanVideo15Pipeline", "HunyuanVideo15ImageToVideoPipeline")
    generates = False

    def key_padding_layers(self, transformer: Any) -> dict[str, Any]:
        if type(transformer).__name__ != TRANSFORMER_CLASS:
            return {}
        from diffusers import HunyuanVideo15Transformer3DModel
        from diffusers.models.attention_processor import AttnProcessor2_0
        from diffusers.models.transformers.transformer_hunyuan_video15 import HunyuanVideo15AttnProcessor2_0

        from sagevideo.pipelines.masks import KeyPadding

        if type(transformer) is not HunyuanVideo15Transformer3DModel:
            return {}
        known = (HunyuanVideo15AttnProcessor2_0, AttnProcessor2_0)  # the stock ones, whose masks are described above
        form = KeyPadding()
        return {key.removesuffix(".processor"): form for key, processor in transformer.attn_processors.items()
                if type(processor) in known}


FAMILY = HunyuanVideo15Family()
