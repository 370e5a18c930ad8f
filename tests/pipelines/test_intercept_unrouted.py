"""A forward under an installed handle that routes no attention call is never silent: it warns once
per handle, says why and how to fix, and `record_backends()` notes every such forward."""

from __future__ import annotations

import warnings

import pytest
from tests.helpers.wan import WAN_ATTENTION_CALLS, run_wan, tiny_wan

import sagevideo


@pytest.fixture
def restore_dispatcher_backend():
    """set_attention_backend() also sets diffusers' process-wide backend, which
    reset_attention_backend() leaves as it is: put it back for the tests that follow."""
    from diffusers.models.attention_dispatch import _AttentionBackendRegistry

    before = _AttentionBackendRegistry._active_backend
    yield
    _AttentionBackendRegistry.set_active_backend(before)


class _AttentionWithoutSDPA:
    """A processor whose attention never reaches F.scaled_dot_product_attention (output: to_out(x))."""

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, rotary_emb=None):
        return attn.to_out[0](hidden_states)


def _unrouted_warnings(caught) -> list[str]:
    return [str(w.message) for w in caught if "routed no attention call" in str(w.message)
            or "routed none of its attention calls" in str(w.message)]


def test_flex_backend_warns_at_install_and_once_per_handle(restore_dispatcher_backend):
    model = tiny_wan()
    model.set_attention_backend("flex")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with sagevideo.install(model, backend="reference"):
            with sagevideo.record_backends() as log:
                run_wan(model)
                run_wan(model)
    at_install = [str(w.message) for w in caught if str(w.message).startswith("sagevideo.install:")]
    assert len(at_install) == 1 and "'flex'" in at_install[0] and "set_attention_backend('native')" in at_install[0]
    forwards = _unrouted_warnings(caught)
    assert len(forwards) == 1, forwards  # two forwards, one warning
    assert "'flex'" in forwards[0] and "set_attention_backend('native')" in forwards[0]
    assert log.counts == {}
    (reason, forwards_noted), = log.summary()["unrouted"].items()
    assert "'flex'" in reason and forwards_noted == 2


def test_native_backend_again_routes_every_call(restore_dispatcher_backend):
    model = tiny_wan()
    model.set_attention_backend("flex")
    with pytest.warns(UserWarning, match="flex"), sagevideo.install(model, backend="reference"):
        model.set_attention_backend("native")  # the fix the warning names
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no unrouted warning now
            with sagevideo.record_backends() as log:
                run_wan(model)
    assert log.summary() == {"counts": {"reference/fp16": WAN_ATTENTION_CALLS}, "fallbacks": {}}


def test_processors_that_do_not_call_sdpa_are_reported():
    model = tiny_wan()
    model.set_attn_processor(_AttentionWithoutSDPA())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with sagevideo.install(model, backend="reference"), sagevideo.record_backends() as log:
            run_wan(model)
    (message,) = _unrouted_warnings(caught)
    assert "_AttentionWithoutSDPA" in message and "scaled_dot_product_attention" in message
    assert log.counts == {} and sum(log.unrouted.values()) == 1


def test_processors_replaced_after_install_are_reported():
    model = tiny_wan()
    with sagevideo.install(model, backend="reference"):
        run_wan(model)  # routes: the handle has seen these processors reach SDPA
        for module in model.modules():
            if hasattr(module, "processor"):
                module.processor = _AttentionWithoutSDPA()
        with pytest.warns(UserWarning, match="_AttentionWithoutSDPA"), sagevideo.record_backends() as log:
            run_wan(model)
    assert sum(log.unrouted.values()) == 1


def test_calls_the_router_declines_are_reported(monkeypatch):
    """SDPA calls that reached the interception but ran stock (e.g. dropout_p > 0)."""
    from sagevideo.pipelines import intercept

    model = tiny_wan()
    monkeypatch.setattr(intercept, "_route", lambda *args, **kwargs: None)
    with sagevideo.install(model, backend="reference"), sagevideo.record_backends() as log:
        with pytest.warns(UserWarning, match="routed none of its attention calls.*stock SDPA ran"):
            run_wan(model)
    assert log.counts == {} and sum(log.unrouted.values()) == 1


def test_a_routed_forward_notes_nothing():
    model = tiny_wan()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with sagevideo.install(model, backend="reference"), sagevideo.record_backends() as log:
            run_wan(model)
    assert log.unrouted == {}
    assert log.summary() == {"counts": {"reference/fp16": WAN_ATTENTION_CALLS}, "fallbacks": {}}


def test_a_forward_whose_layers_all_reuse_a_cache_is_not_reported():
    """After a routed forward, a forward where every attention module skips its processor (as attention
    caches do) is expected, not a silent fallback."""
    model = tiny_wan()
    attention = [m for m in model.modules() if hasattr(m, "processor")]
    with sagevideo.install(model, backend="reference"):
        run_wan(model)
        try:
            for m in attention:  # reuse: return the input as the output, never calling the processor
                m.forward = lambda hidden_states, *args, **kwargs: hidden_states
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                with sagevideo.record_backends() as log:
                    run_wan(model)
        finally:
            for m in attention:
                del m.forward  # the class's forward shows through again
    assert log.counts == {} and log.unrouted == {}
