"""`sagevideo.choices`: FP8 P·V where the GPU has FP8 tensor cores (NVIDIA sm89+), device "auto"."""

from __future__ import annotations


def test_choices_rules(monkeypatch):
    import torch

    from sagevideo.choices import auto_pv, has_fp8_tensor_cores, resolve_device

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    monkeypatch.setattr(torch.version, "hip", None)
    assert has_fp8_tensor_cores("cuda") and auto_pv("cuda:0") == "fp8" and auto_pv("cpu") == "fp16"
    monkeypatch.setattr(torch.version, "hip", "6.2")
    assert auto_pv("cuda") == "fp16"  # the sm89 rule is NVIDIA's
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == "cpu" and resolve_device("cuda") == "cuda"


def test_sparse_text_reads_back_and_bad_settings_say_the_fix():
    import pytest

    from sagevideo.choices import parse_sparse, sparse_text

    assert parse_sparse("dynamic:0.15") == ("dynamic", 0.15, None)
    assert parse_sparse(" Static:1 ") == ("static", 1.0, None)
    assert parse_sparse("off") is None
    assert parse_sparse(sparse_text("static", 0.123456789)) == ("static", 0.123456789, None)
    assert parse_sparse("dynamic:0.15:Reuse2") == ("dynamic", 0.15, 2) and sparse_text("dynamic", 0.15, 2) == \
        "dynamic:0.15:reuse2"
    once = parse_sparse(sparse_text("dynamic", 0.15, 1))
    assert parse_sparse("dynamic:0.15:reuse1") == ("dynamic", 0.15, None) == once
    for bad, match in (("dense:0.1", "unknown method 'dense'"), ("dynamic", "give METHOD:DENSITY"),
                       ("dynamic:x", "'x' is not a number"), ("dynamic:0", r"outside \(0, 1\]"),
                       ("static:1.5", r"outside \(0, 1\]"), ("dynamic:nan", r"outside \(0, 1\]"),
                       ("dynamic:0.15:reuse0", "'reuse0' is not reuseN with N >= 1"),
                       ("dynamic:0.15:twice", "'twice' is not reuseN"),
                       ("static:0.3:reuse2", "only dynamic selection reuses")):
        with pytest.raises(ValueError, match=match):
            parse_sparse(bad)
