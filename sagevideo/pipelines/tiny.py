"""Parts that every family's built-in tiny model shares (each family's configs live in its own
folder, e.g. `sagevideo.pipelines.cogvideox.tiny`): a byte-level T5-style tokenizer, so that tiny
models need no vocabulary file and no download.
"""

from __future__ import annotations

_SPECIALS = ("<pad>", "</s>", "<unk>")  # ids 0, 1, 2 as in T5


def tiny_tokenizer():
    """A byte-level T5-style tokenizer built in memory: one token per UTF-8 byte, then `</s>`.

    Byte-level keeps every prompt distinct (no [UNK] collapsing two unknown prompts into one
    embedding) without shipping a vocabulary file.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())  # 256 printable stand-ins for bytes
    vocab = {tok: i for i, tok in enumerate((*_SPECIALS, *alphabet))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.TemplateProcessing(
        single="$A </s>", pair="$A </s> $B </s>", special_tokens=[("</s>", vocab["</s>"])]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<pad>",
        eos_token="</s>",
        unk_token="<unk>",
    )  # no model_max_length: diffusers' own truncation warning is the one that names the lost text
