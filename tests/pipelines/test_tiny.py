"""What every family's tiny model shares (`pipelines/tiny.py`): a byte-level tokenizer that keeps prompts apart."""

import torch


def test_tokenizer_keeps_prompts_apart(tiny_pipe):
    tok = tiny_pipe.tokenizer
    ids = tok(
        ["a cat", "a dog", "ein Hund 🐕"],
        padding="max_length",
        max_length=16,
        truncation=True,
        add_special_tokens=True,
        return_tensors="pt",
    ).input_ids
    assert ids.shape == (3, 16)
    assert len({tuple(row.tolist()) for row in ids}) == 3
    assert (ids == tok.eos_token_id).sum(dim=1).tolist() == [1, 1, 1]
    assert tok.batch_decode(tok(["ein Hund 🐕"]).input_ids, skip_special_tokens=True) == ["ein Hund 🐕"]

    embeds = tiny_pipe.encode_prompt(
        ["a cat", "a dog"],
        do_classifier_free_guidance=False,
        max_sequence_length=32,
        device=torch.device("cpu"),
    )[0]
    assert not torch.allclose(embeds[0], embeds[1])
