"""`pipelines/forwards`: the attention calls of one step, read on the meta device, and the config names."""

import pytest

from sagevideo.pipelines.forwards import AttentionCallShape, attention_calls, known_config


def test_attention_calls_are_read_from_the_model_on_the_meta_device():
    # tiny Wan: 2 blocks x 2 guidance forwards, each block a self-attention over the 48 video
    # tokens and a cross-attention to the 8 text tokens
    assert attention_calls("tiny-wan") == [AttentionCallShape(1, 2, 48, 48, 64, False, 4),
                                           AttentionCallShape(1, 2, 48, 8, 64, False, 4)]
    (joint,) = attention_calls("tiny-cogvideox")  # video and text tokens attend jointly, CFG batch 2
    assert (joint.batch, joint.n_q, joint.n_k) == (2, 48 + 226, 48 + 226)


def test_config_names_are_checked():
    assert known_config("wan-14b") == "wan-14b"
    with pytest.raises(ValueError, match="unknown model config 'wan'; use one of cogvideox-5b"):
        known_config("wan")


def test_open_soras_768px_config_is_its_768px_bucket():
    """Open-Sora 2.0's "768px" is an area bucket: 576x1024 at 16:9, 129 frames -> 33 x 36 x 64 =
    76,032 video tokens + 512 text tokens (OPENSORA.md's table), not 768 pixels high."""
    (call,) = attention_calls("opensora-768px")
    assert (call.n_q, call.head_dim, call.calls) == (76032 + 512, 128, 57)
