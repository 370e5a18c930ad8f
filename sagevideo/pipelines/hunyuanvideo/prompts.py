"""HunyuanVideo's prompt template, cropped as the pipeline's own tokenizer counts it.

`HunyuanVideoPipeline` wraps every prompt in a Llama 3 chat template (a system message describing
what to detail, then the prompt as the user turn), runs the Llama over `crop_start + 256` tokens
and drops the first `crop_start` hidden states: what the transformer sees is the prompt and the
closing `<|eot_id|>`, padded to 256 tokens. diffusers hard-codes `crop_start=95`, the template's
length in HunyuanVideo's Llama 3 tokenizer; `prompt_template(tokenizer)` counts it with the
pipeline's own tokenizer instead (95 for the real one), so a model with another tokenizer (the
built-in tiny model's byte-level one) crops exactly the template too.

`prompt_tokens` is what the job check uses before loading: a prompt longer than the pipeline
reads would be cut without a word (the Llama tokenizer truncates silently).
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

# diffusers' DEFAULT_PROMPT_TEMPLATE["template"] (pipeline_hunyuan_video.py), copied so that the driver
# counts prompt tokens without importing diffusers; tests check the two are equal.
TEMPLATE = (
    "<|start_header_id|>system<|end_header_id|>\n\nDescribe the video by detailing the following aspects: "
    "1. The main content and theme of the video."
    "2. The color, shape, size, texture, quantity, text, and spatial relationships of the objects."
    "3. Actions, events, behaviors temporal relationships, physical movement changes of the objects."
    "4. background environment, light, style and atmosphere."
    "5. camera angles, movements, and transitions used in the video:<|eot_id|>"
    "<|start_header_id|>user<|end_header_id|>\n\n{}<|eot_id|>"
)
DIFFUSERS_CROP_START = 95  # diffusers' count, for HunyuanVideo's Llama 3 tokenizer


def crop_start(tokenizer: Any) -> int:
    """Tokens of the template before the prompt (with the BOS token), as `tokenizer` counts them."""
    return len(tokenizer(TEMPLATE.split("{}")[0]).input_ids)


def prompt_template(tokenizer: Any) -> dict[str, Any]:
    """The `prompt_template` argument of `HunyuanVideoPipeline.__call__` for this tokenizer."""
    return {"template": TEMPLATE, "crop_start": crop_start(tokenizer)}


def prompt_tokens(tokenizer: Any, prompt: str) -> int:
    """Llama tokens the transformer would get from `prompt` before padding (the closing `<|eot_id|>`
    included), uncut."""
    return len(tokenizer(TEMPLATE.format(prompt)).input_ids) - crop_start(tokenizer)


@lru_cache(maxsize=4)
def folder_tokenizer(path: str) -> Any:
    """The Llama tokenizer of a HunyuanVideo folder (tokenizer/), loaded once per folder (local files only)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(Path(path) / "tokenizer", local_files_only=True)


@lru_cache(maxsize=1)
def tiny_tokenizer() -> Any:
    from sagevideo.pipelines.hunyuanvideo.tiny import tiny_llama_tokenizer

    return tiny_llama_tokenizer()
