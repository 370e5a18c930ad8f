"""The LTX family: LTX-Video (diffusers `LTXPipeline`, `LTXImageToVideoPipeline`, `LTXConditionPipeline`,
`LTXVideoTransformer3DModel`) and LTX-2 (`LTX2Pipeline`, `LTX2ImageToVideoPipeline`,
`LTX2ConditionPipeline`, `LTX2VideoTransformer3DModel`, audio and video). Registered in
`sagevideo.pipelines.families` for `install`: sagevideo does not load, generate or split them
(generate refuses their folders, saying so).

- attention: diffusers' dispatcher (`LTXVideoAttnProcessor`; `LTX2AudioVideoAttnProcessor` or
  `LTX2PerturbedAttnProcessor`), so `install` intercepts SDPA inside the transformer;
- masks: the text cross-attention (`attn2`, and LTX-2's `audio_attn2`) masks the padded prompt as
  an additive float, 0 for a token and -10000 for padding, copied per head ((B, H, 1, T)): key
  padding, which the kernels take as a key mask (`key_padding_layers`, `pipelines.masks`; -10000
  gives a padded key the weight exp(-10000) = 0 in fp32 under SDPA too). Every such mask is checked
  before it is read so. Other masks (LTX-2's IC-LoRA self-attention weights) run SDPA, recorded.
Nothing here imports torch or diffusers at import time.
"""

from __future__ import annotations

from typing import Any

from sagevideo.pipelines.families import ModelFamily

MASK_FILL = -10000.0  # what both transformers' forwards add for a padded text token
# transformer class -> (its module in diffusers, its stock processors' names)
TRANSFORMERS = {
    "LTXVideoTransformer3DModel": ("transformer_ltx", ("LTXVideoAttnProcessor",)),
    "LTX2VideoTransformer3DModel": ("transformer_ltx2", ("LTX2AudioVideoAttnProcessor", "LTX2PerturbedAttnProcessor")),
}
TEXT_LAYERS = ("attn2", "audio_attn2")  # cross-attention to the prompt, in each transformer block


class LTXFamily(ModelFamily):
    name = "ltx"
    title = "LTX-Video / LTX-2"
    pipeline_classes = ("LTXPipeline", "LTXImageToVideoPipeline", "LTXConditionPipeline",
                        "LTX2Pipeline", "LTX2ImageToVideoPipeline", "LTX2ConditionPipeline")
    generates = False

    def key_padding_layers(self, transformer: Any) -> dict[str, Any]:
        name = type(transformer).__name__
        if name not in TRANSFORMERS:
            return {}
        import importlib

        import diffusers

        from sagevideo.pipelines.masks import KeyPadding

        if type(transformer) is not getattr(diffusers, name):
            return {}
        module_name, processor_names = TRANSFORMERS[name]
        module = importlib.import_module(f"diffusers.models.transformers.{module_name}")
        known = tuple(getattr(module, processor) for processor in processor_names)
        form = KeyPadding(fill=MASK_FILL)
        layers = {}
        for key, processor in transformer.attn_processors.items():
            layer = key.removesuffix(".processor")
            if layer.rsplit(".", 1)[-1] in TEXT_LAYERS and type(processor) in known:
                layers[layer] = form
        return layers


FAMILY = LTXFamily()
