"""`sageattn`'s contract: validation, fallback policy, backend records, LSE, masks, no mutation."""

import warnings

import pytest
import torch
import torch.nn.functional as F

import sagevideo
from sagevideo import last_backend, record_backends, sageattn
from sagevideo.attention.accuracy import attention_fp64, error_stats
from sagevideo.eval.numerics.presets import make_inputs

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _qkv(shape=(1, 2, 64, 64), dtype=torch.float16, seed=0, preset="random"):
    x = make_inputs(preset, shape, seed)
    return tuple(t.to(DEVICE, dtype) for t in (x.q, x.k, x.v))


# ---- bad input -------------------------------------------------------------------------------

@pytest.mark.parametrize(
    "make, error, match",
    [
        (lambda q, k, v: (q[0], k, v), ValueError, "q must have rank 4"),
        (lambda q, k, v: (q, k[:, :1], v), ValueError, "head counts differ"),
        (lambda q, k, v: (q, k.repeat(2, 1, 1, 1), v), ValueError, "batch sizes differ"),
        (lambda q, k, v: (q, k[..., :32], v), ValueError, "head dims differ"),
        (lambda q, k, v: (q, k, v[:, :, :10]), ValueError, "sequence lengths differ"),
        (lambda q, k, v: (q[:, :, :0], k, v), ValueError, "empty sequence"),
        (lambda q, k, v: (q, k.float(), v), TypeError, "different dtypes"),
        (lambda q, k, v: (q, k.int(), v), TypeError, "k must be a floating tensor"),
        (lambda q, k, v: (q, k.numpy() if k.device.type == "cpu" else k.tolist(), v), TypeError, "torch.Tensor"),
        (lambda q, k, v: (q, k.to("meta"), v), ValueError, "different devices"),
    ],
    ids=["rank", "heads", "batch", "head-dim", "kv-length", "empty", "dtype", "int", "not-tensor", "device"],
)
def test_bad_tensors_raise_clear_errors(make, error, match):
    with pytest.raises(error, match=match):
        sageattn(*make(*_qkv()))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"tensor_layout": "BHND"}, "tensor_layout='BHND' is not supported"),
        ({"pv": "int8"}, "pv='int8'"),
        ({"backend": "cuda"}, "backend='cuda'"),
        ({"qk_granularity": "warp"}, "qk_granularity"),
        ({"sm_scale": -1.0}, "sm_scale must be a positive"),
        ({"attn_mask": torch.ones(3, 1, 1, 64, dtype=torch.bool)}, "does not broadcast"),
        ({"attn_mask": torch.ones(1, 1, 1, 64, dtype=torch.bool), "is_causal": True}, "not both"),
    ],
)
def test_bad_options_raise_clear_errors(kwargs, match):
    q, k, v = _qkv()
    if "attn_mask" in kwargs:
        kwargs = {**kwargs, "attn_mask": kwargs["attn_mask"].to(DEVICE)}
    with pytest.raises(ValueError, match=match):
        sageattn(q, k, v, **kwargs)


# ---- fallback policy ---------------------------------------------------------------------------

def test_auto_falls_back_for_fp32_records_and_warns_once():
    q, k, v = _qkv(dtype=torch.float32)
    with record_backends() as log, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out1 = sageattn(q, k, v)
        sageattn(q, k, v)
    choice = last_backend()
    assert choice.ran == "sdpa" and choice.requested == "auto" and "float32" in choice.reason
    assert log.counts == {"sdpa": 2}
    assert sum("float32" in str(w.message) for w in caught) <= 1  # once per process and reason
    torch.testing.assert_close(out1, F.scaled_dot_product_attention(q, k, v))


def test_explicit_triton_raises_instead_of_falling_back():
    q, k, v = _qkv(dtype=torch.float32)
    with pytest.raises(ValueError, match="backend='triton' cannot run: dtype torch.float32"):
        sageattn(q, k, v, backend="triton")


@pytest.mark.skipif(DEVICE == "cuda", reason="CPU-only policy")
def test_cpu_tensors_fall_back_without_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    q, k, v = _qkv()
    sageattn(q, k, v)
    assert last_backend().ran == "sdpa" and "CPU tensors" in last_backend().reason
    with pytest.raises(ValueError, match="CPU tensors"):
        sageattn(q, k, v, backend="triton")


def test_head_dim_above_128_falls_back_or_raises():
    q, k, v = _qkv(shape=(1, 1, 16, 160))
    sageattn(q, k, v)
    assert last_backend().ran == "sdpa" and "head dim 160" in last_backend().reason
    with pytest.raises(ValueError, match="head dim 160"):
        sageattn(q, k, v, backend="triton")


def test_general_mask_falls_back_to_sdpa_never_dropped():
    q, k, v = _qkv(shape=(1, 2, 32, 64))
    mask = torch.rand(32, 32, device=DEVICE) > 0.3  # depends on the query: not key padding
    mask[:, 0] = True
    out = sageattn(q, k, v, attn_mask=mask)
    assert last_backend().ran == "sdpa" and "not a key-padding mask" in last_backend().reason
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
    for backend in ("triton", "reference"):
        with pytest.raises(ValueError, match="not a key-padding mask"):
            sageattn(q, k, v, attn_mask=mask, backend=backend)
    float_mask = torch.zeros(1, 1, 1, 32, device=DEVICE, dtype=torch.float16)
    with pytest.raises(ValueError, match="only boolean"):
        sageattn(q, k, v, attn_mask=float_mask, backend="triton")


@pytest.mark.parametrize("backend", ["triton", "reference"])
def test_a_key_mask_expanded_over_heads_and_queries_runs_in_the_kernels(backend):
    """A (B, Nk) key mask broadcast to (B, H, Nq, Nk) with `expand` (stride 0 over heads and
    queries) is the same key-padding mask: the kernels take it (no SDPA fallback), with the result
    of its (B, 1, 1, Nk) form, equal to SDPA with the expanded mask. A materialized copy of it is
    a general mask: SDPA under auto, an error for an explicit backend."""
    from sagevideo.attention.functional import broadcast_dims_dropped, key_padding_problem

    q, k, v = _qkv((2, 2, 64, 64), seed=3)
    keep = torch.ones(2, 64, dtype=torch.bool, device=DEVICE)
    keep[1, 40:] = False
    expanded = keep[:, None, None].expand(2, 2, 64, 64)
    assert broadcast_dims_dropped(expanded).shape == (2, 1, 1, 64) and key_padding_problem(expanded, 64) == ""
    with record_backends() as log:
        out = sageattn(q, k, v, attn_mask=expanded, backend=backend)
    assert log.fallback_reasons == {} and last_backend().ran in (backend, "gluon")
    assert torch.equal(out, sageattn(q, k, v, attn_mask=keep[:, None, None], backend=backend))
    want = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=expanded)
    assert error_stats(want, out).cos_worst > 0.999

    materialized = expanded.contiguous()
    assert "(2, 2, 64, 64) is not a key-padding mask" in key_padding_problem(materialized, 64)
    with pytest.raises(ValueError, match="not a key-padding mask"):
        sageattn(q, k, v, attn_mask=materialized, backend=backend)


def test_sdpa_backend_is_plain_sdpa():
    q, k, v = _qkv()
    out = sageattn(q, k, v, backend="sdpa", is_causal=True)
    assert last_backend().ran == "sdpa" and not last_backend().is_fallback
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, is_causal=True))


# ---- semantics ---------------------------------------------------------------------------------

@pytest.mark.parametrize("backend", ["triton", "reference"])
def test_inputs_are_not_modified(backend):
    q, k, v = _qkv(preset="k-offset")
    mask = torch.ones(1, 1, 1, 64, dtype=torch.bool, device=DEVICE)
    mask[..., 50:] = False
    copies = [t.clone() for t in (q, k, v, mask)]
    sageattn(q, k, v, attn_mask=mask, backend=backend, pv="fp8", return_lse=True)
    for before, after in zip(copies, (q, k, v, mask), strict=True):
        assert torch.equal(before, after)


@pytest.mark.parametrize("backend", ["triton", "reference", "sdpa"])
def test_lse_merges_key_shards_exactly(backend):
    """Attention over two halves of the keys, merged by LSE, equals attention over all keys.
    The K offset makes each half's mean different: without the q·mean(K) correction it fails."""
    q, k, v = _qkv(shape=(1, 2, 96, 64), preset="k-offset", seed=4)
    halves = [(k[:, :, :70], v[:, :, :70]), (k[:, :, 70:], v[:, :, 70:])]
    outs, lses = zip(*(sageattn(q, kh, vh, backend=backend, return_lse=True) for kh, vh in halves), strict=True)
    weights = torch.softmax(torch.stack(lses), dim=0)[..., None]
    merged = (weights * torch.stack([o.float() for o in outs])).sum(0)
    ref = attention_fp64(q.float(), k.float(), v.float())
    assert error_stats(ref, merged).cos_worst > 0.9995


@pytest.mark.parametrize("backend", ["triton", "reference"])
def test_padding_with_huge_values_does_not_change_valid_result(backend):
    q, k, v = _qkv(shape=(2, 2, 80, 64), seed=6)
    lengths = torch.tensor([50, 80])
    mask = (torch.arange(80)[None, :] < lengths[:, None]).to(DEVICE)
    padded_k = torch.where(mask[:, None, :, None], k, torch.full_like(k, 6e4))
    padded_v = torch.where(mask[:, None, :, None], v, torch.full_like(v, -6e4))
    out = sageattn(q, padded_k, padded_v, attn_mask=mask[:, None, None, :], backend=backend)
    trimmed = sageattn(q[:1], k[:1, :, :50], v[:1, :, :50], backend=backend)
    assert torch.isfinite(out).all()
    assert error_stats(trimmed.float(), out[:1].float()).cos_worst > 0.99999
    ref = attention_fp64(q.float(), k.float(), v.float(), key_mask=mask)
    assert error_stats(ref, out).cos_worst > 0.999


@pytest.mark.slow  # torch.compile
def test_compile_fullgraph_does_not_break():
    q, k, v = _qkv()

    def attend(q, k, v):
        return sageattn(q, k, v, backend="triton")

    torch._dynamo.reset()
    # "eager" checks Dynamo captures one graph; kernels run as-is (the GPU test uses Inductor)
    compiled = torch.compile(attend, fullgraph=True, backend="eager")
    torch.testing.assert_close(compiled(q, k, v), attend(q, k, v))


# ---- SDPA's signature, grouped-query heads, masks of any rank ---------------------------------

def test_scaled_dot_product_attention_has_sdpa_signature_and_semantics():
    """One import switches model code: SDPA's parameters in SDPA's order with SDPA's defaults (then
    keyword-only extras), positional attn_mask, scale=, dropout_p=0.0, rank-3 and rank-5 inputs."""
    import inspect

    # torch's documented signature (the builtin has no introspectable one)
    theirs = [("query", inspect.Parameter.empty), ("key", inspect.Parameter.empty), ("value", inspect.Parameter.empty),
              ("attn_mask", None), ("dropout_p", 0.0), ("is_causal", False), ("scale", None), ("enable_gqa", False)]
    ours = list(inspect.signature(sagevideo.scaled_dot_product_attention).parameters.values())
    assert [(p.name, p.default) for p in ours[: len(theirs)]] == theirs
    assert all(p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD for p in ours[: len(theirs)])
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in ours[len(theirs):])

    q, k, v = _qkv((2, 2, 64, 64))
    mask = torch.ones(64, dtype=torch.bool, device=DEVICE)
    mask[50:] = False
    for args, kwargs in [((q, k, v, mask), {}), ((q, k, v), {"scale": 0.2, "dropout_p": 0.0}),
                         ((q[:, 0], k[:, 0], v[:, 0]), {}), ((q[None], k[None], v[None]), {})]:
        out = sagevideo.scaled_dot_product_attention(*args, **kwargs, backend="reference")
        # pv="auto": FP8 P·V on GPUs with FP8 tensor cores, 16-bit elsewhere
        assert last_backend().ran == "reference"
        assert last_backend().pv == sagevideo.attention.functional.auto_pv(q.device)
        # SDPA's own kernels reject a 1-D mask that broadcasts (IndexError): give them its 4-D view
        want = F.scaled_dot_product_attention(*(t.float() for t in args[:3]), *(m[None, None, None] for m in args[3:]),
                                              **kwargs)
        assert out.shape == want.shape and out.dtype == q.dtype
        assert error_stats(want, out).cos_worst > (0.998 if last_backend().pv == "fp8" else 0.999)


def test_what_the_kernels_cannot_compute_is_a_recorded_fallback_or_an_error(monkeypatch):
    monkeypatch.setattr(sagevideo.attention.records, "_warned", set())  # each fallback reason warns once a process
    q, k, v = _qkv()
    with pytest.warns(UserWarning, match="dropout_p=0.5"), record_backends() as log:
        sagevideo.scaled_dot_product_attention(q.float(), k.float(), v.float(), dropout_p=0.5)
    assert log.fallback_reasons == {"dropout_p=0.5: the kernels compute no dropout": 1}
    with pytest.raises(ValueError, match="backend='reference' cannot run: dropout_p"):
        sagevideo.scaled_dot_product_attention(q, k, v, dropout_p=0.5, backend="reference")
    with pytest.raises(ValueError, match="value head dim 32"):
        sagevideo.scaled_dot_product_attention(q, k, v[..., :32], backend="reference")


@pytest.mark.parametrize("backend", ["triton", "reference", "sdpa"])
@pytest.mark.parametrize("pv", ["fp16", "fp8"])
def test_grouped_query_heads_equal_repeated_kv_heads(backend, pv):
    """enable_gqa: K/V heads broadcast over their query-head group in the kernels' index math (no
    copy), which must give exactly what the repeated K/V heads give; and SDPA's answer."""
    q, _, _ = _qkv((2, 4, 100, 64), seed=3)
    _, k, v = _qkv((2, 2, 100, 64), seed=4)
    mask = torch.ones(2, 1, 1, 100, dtype=torch.bool, device=DEVICE)
    mask[1, ..., 70:] = False
    kw = dict(pv=pv, backend=backend, attn_mask=mask)
    grouped, lse = sageattn(q, k, v, enable_gqa=True, return_lse=True, **kw)
    repeated, lse_rep = sageattn(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), return_lse=True, **kw)
    assert torch.equal(grouped, repeated) and torch.allclose(lse, lse_rep, atol=1e-6)
    want = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask, enable_gqa=True)
    assert error_stats(want, grouped).cos_worst > 0.99


def test_grouped_query_heads_need_enable_gqa_like_sdpa():
    q, k, v = _qkv((1, 4, 64, 64))
    with pytest.raises(ValueError, match="pass enable_gqa=True"):
        sageattn(q, k[:, :2], v[:, :2])
    with pytest.raises(ValueError, match="must divide"):
        sageattn(q, k[:, :3], v[:, :3], enable_gqa=True)


@pytest.mark.parametrize("backend", ["auto", "triton", "reference", "sdpa"])
def test_a_one_dimensional_key_mask_means_the_same_on_every_backend(backend):
    """(Nk,) bool masks run in the kernels; SDPA's own kernels reject them (IndexError under auto)."""
    q, k, v = _qkv((1, 2, 64, 64), seed=5)
    mask = torch.ones(64, dtype=torch.bool, device=DEVICE)
    mask[40:] = False
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = sageattn(q, k, v, attn_mask=mask, backend=backend)
    want = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask[None, None, None])
    assert error_stats(want, out).cos_worst > 0.999


# ---- forward only, interpreter limits, compiled records ---------------------------------------

@pytest.mark.parametrize("backend", ["triton", "reference"])
def test_quantized_backends_refuse_backward_with_one_clear_error(backend):
    """Autograd through the reference's rounding gives q/k gradients of cosine ≈ 0 against SDPA's, so
    every quantized backend refuses a backward, at backward time (inference without no_grad still
    runs)."""
    q, k, v = (t.requires_grad_() for t in _qkv())
    out = sageattn(q, k, v, backend=backend)
    with pytest.raises(RuntimeError, match="forward-only"):
        out.sum().backward()


def test_the_sdpa_backend_differentiates_exactly_as_sdpa():
    q, k, v = (t.float().requires_grad_() for t in _qkv())
    sageattn(q, k, v, backend="sdpa").sum().backward()
    grads = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    F.scaled_dot_product_attention(q, k, v).sum().backward()
    assert all(torch.equal(a, t.grad) for a, t in zip(grads, (q, k, v), strict=True))


@pytest.mark.skipif(DEVICE == "cuda", reason="the interpreter's limits (CPU)")
def test_bfloat16_under_the_interpreter_is_refused_not_garbage(monkeypatch):
    monkeypatch.setattr(sagevideo.attention.records, "_warned", set())
    q, k, v = _qkv(dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="bfloat16 under TRITON_INTERPRET"):
        sageattn(q, k, v, backend="triton")
    with pytest.warns(UserWarning, match="bfloat16 under TRITON_INTERPRET"):
        out = sageattn(q, k, v, backend="auto")
    assert last_backend().ran == "sdpa"
    assert error_stats(F.scaled_dot_product_attention(q.float(), k.float(), v.float()), out).cos_worst > 0.999


@pytest.mark.slow  # torch.compile
@pytest.mark.parametrize("backend", ["triton", "reference", "sdpa"])
def test_records_hold_inside_a_compiled_graph(backend):
    """Each run of a compiled graph reports what it calls, not only the trace (aot_eager: AOT autograd
    would drop an op without outputs; the Triton op under the CPU interpreter only traces with
    Dynamo's "eager"; the GPU test runs Inductor)."""
    q, k, v = _qkv()

    def attend(q, k, v):
        return sageattn(q, k, v, backend=backend) * 2

    torch._dynamo.reset()
    interpreted = backend == "triton" and DEVICE == "cpu"
    compiled = torch.compile(attend, fullgraph=True, backend="eager" if interpreted else "aot_eager")
    compiled(q, k, v)  # traced here
    with record_backends() as log:
        compiled(q, k, v)
        compiled(q, k, v)
    assert log.counts == {("sdpa" if backend == "sdpa" else f"{backend}/fp16"): 2}


@pytest.mark.slow  # torch.compile
def test_a_fallback_inside_a_compiled_graph_warns_when_the_graph_runs_without_breaking_it(monkeypatch):
    """A fallback's warning is given by the record op at run time: a warnings.warn while Dynamo
    traces would break the graph (fullgraph=True raises on a break)."""
    monkeypatch.setattr(sagevideo.attention.records, "_warned", set())
    q, k, v = (t.float() for t in _qkv())

    def attend(q, k, v):
        return sagevideo.scaled_dot_product_attention(q, k, v, dropout_p=0.5) * 2

    torch._dynamo.reset()
    compiled = torch.compile(attend, fullgraph=True, backend="aot_eager")
    with pytest.warns(UserWarning, match="dropout_p=0.5"), record_backends() as log:
        compiled(q, k, v)
    assert [c.ran for c in log.choices] == ["sdpa"] and "dropout_p=0.5" in log.choices[0].reason


# ---- `F.scaled_dot_product_attention = sagevideo.scaled_dot_product_attention` ------------------

@pytest.fixture
def sdpa_replaced():
    """SageAttention users' global replacement of torch's SDPA by sagevideo's; torch's back after.
    Yields torch's own SDPA (what the fallbacks must compute)."""
    original = F.scaled_dot_product_attention
    F.scaled_dot_product_attention = sagevideo.scaled_dot_product_attention
    try:
        yield original
    finally:
        F.scaled_dot_product_attention = original


def test_fallbacks_call_torchs_own_sdpa_the_one_F_is_bound_to():
    from sagevideo.attention.functional import TORCH_SDPA

    assert TORCH_SDPA is torch._C._nn.scaled_dot_product_attention is F.scaled_dot_product_attention


@pytest.mark.parametrize(
    "dtype, kwargs, reason",
    [
        (torch.float16, {"dropout_p": 0.5}, "dropout_p=0.5"),
        (torch.float32, {}, "dtype torch.float32"),
        (torch.float16, {"attn_mask": "float"}, "attn_mask of dtype torch.float16"),
    ],
    ids=["dropout", "fp32", "float-mask"],
)
def test_a_fallback_under_the_global_replacement_runs_torchs_sdpa_without_recursing(sdpa_replaced, dtype, kwargs,
                                                                                    reason):
    """The fallback used to call F.scaled_dot_product_attention, i.e. itself: RecursionError."""
    q, k, v = _qkv(dtype=dtype)
    if kwargs.get("attn_mask") == "float":
        kwargs = {"attn_mask": torch.randn(1, 1, 64, 64, device=DEVICE, dtype=dtype)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.manual_seed(0)  # the same dropout draws for both calls
        out = F.scaled_dot_product_attention(q, k, v, **kwargs)
    assert last_backend().ran == "sdpa" and reason in last_backend().reason
    torch.manual_seed(0)
    assert torch.equal(out, sdpa_replaced(q, k, v, **kwargs))


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_model_code_runs_under_the_global_replacement(sdpa_replaced, dtype):
    """diffusers' AttnProcessor2_0 calls F.scaled_dot_product_attention by attribute: sagevideo's
    here, the kernels for fp16 and torch's SDPA for fp32 (a fallback), as it would without the
    replacement through sagevideo.scaled_dot_product_attention."""
    from diffusers.models.attention_processor import Attention, AttnProcessor2_0

    torch.manual_seed(0)
    attn = Attention(query_dim=64, heads=2, dim_head=64, processor=AttnProcessor2_0()).to(DEVICE, dtype)
    x = torch.randn(1, 64, 64, device=DEVICE, dtype=dtype)
    with torch.no_grad(), record_backends() as log, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = attn(x)
    F.scaled_dot_product_attention = sdpa_replaced
    with torch.no_grad():
        want = attn(x.float() if dtype == torch.float32 else x)
    if dtype == torch.float32:
        assert log.counts == {"sdpa": 1} and torch.equal(out, want)
    else:
        assert list(log.counts) == [f"triton/{sagevideo.attention.functional.auto_pv(x.device)}"]
        assert error_stats(want.float(), out).cos_worst > 0.998


@pytest.mark.slow  # torch.compile
def test_a_compiled_fallback_under_the_global_replacement_does_not_recurse(sdpa_replaced):
    q, k, v = (t.float() for t in _qkv())

    def attend(q, k, v):
        return F.scaled_dot_product_attention(q, k, v) * 2

    torch._dynamo.reset()
    compiled = torch.compile(attend, fullgraph=True, backend="aot_eager")
    with warnings.catch_warnings(), record_backends() as log:
        warnings.simplefilter("ignore")
        out = compiled(q, k, v)
    assert [c.ran for c in log.choices] == ["sdpa"]
    assert torch.equal(out, sdpa_replaced(q, k, v) * 2)


# ---- SDPA's calls the kernels take only in another form ---------------------------------------

def _attention_fp64(q, k, v, scale, mask=None):
    """softmax(q·kᵀ·scale + mask)·v in fp64 (a bool mask: False = -inf), as SDPA's docs define it."""
    s = q.double() @ k.double().transpose(-1, -2) * scale
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    return torch.softmax(s, dim=-1) @ v.double()


@pytest.mark.parametrize("scale", [0.0, -0.0, -0.3])
@pytest.mark.parametrize("backend", ["auto", "reference", "sdpa"])
def test_a_zero_or_negative_scale_computes_sdpas_attention(backend, scale):
    """SDPA takes any finite scale (0: uniform attention over the valid keys). The kernels, whose INT8
    Q scale must be positive, compute the same attention of (-q, -scale) or (q·0, 1): no fallback;
    on backend="sdpa" bit-identical to torch's where torch's own kernels compute it (here: CPU)."""
    from sagevideo.attention.functional import TORCH_SDPA

    q, k, v = _qkv((2, 2, 64, 64), seed=7)
    mask = torch.ones(2, 1, 1, 64, dtype=torch.bool, device=DEVICE)
    mask[1, ..., 40:] = False
    out = sagevideo.scaled_dot_product_attention(q, k, v, mask, scale=scale, backend=backend)
    assert not last_backend().is_fallback
    assert error_stats(_attention_fp64(q, k, v, scale, mask), out).cos_worst > 0.998
    if backend == "sdpa" and DEVICE == "cpu":
        assert torch.equal(out, TORCH_SDPA(q, k, v, attn_mask=mask, scale=scale))


@pytest.mark.parametrize("scale", [float("inf"), float("nan")])
def test_a_scale_that_is_not_finite_runs_sdpa_or_raises(scale):
    from sagevideo.attention.functional import TORCH_SDPA

    q, k, v = _qkv()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = sagevideo.scaled_dot_product_attention(q, k, v, scale=scale)
    assert last_backend().ran == "sdpa" and f"scale={scale}: the kernels take a finite scale" in last_backend().reason
    torch.testing.assert_close(out, TORCH_SDPA(q, k, v, scale=scale), equal_nan=True)
    with pytest.raises(ValueError, match=f"backend='reference' cannot run: scale={scale}"):
        sagevideo.scaled_dot_product_attention(q, k, v, scale=scale, backend="reference")


def _cos_floor(pv: str) -> float:
    """Worst cosine against fp64 attention at these tiny random shapes: FP8 P·V (GPUs, pv="auto") a little lower."""
    return 0.998 if pv == "fp8" else 0.999


BROADCASTS = {  # query, key, value shapes that SDPA broadcasts
    "one-kv-head": ((2, 4, 64, 64), (2, 1, 64, 64), (2, 1, 64, 64)),
    "query-batch-1": ((1, 2, 64, 64), (2, 2, 64, 64), (2, 2, 64, 64)),
    "kv-batch-1": ((2, 2, 64, 64), (1, 2, 64, 64), (1, 2, 64, 64)),
    "query-head-1": ((2, 1, 64, 64), (2, 2, 64, 64), (2, 2, 64, 64)),
    "one-key-head": ((1, 2, 64, 64), (1, 1, 64, 64), (1, 2, 64, 64)),
    "kv-rank-3": ((2, 2, 64, 64), (2, 64, 64), (2, 64, 64)),
    "rank-5": ((2, 1, 2, 64, 64), (1, 3, 1, 64, 64), (1, 3, 1, 64, 64)),
    "rank-3-kv-batch-1": ((2, 64, 64), (1, 64, 64), (1, 64, 64)),
}


def _broadcast_inputs(shapes, seed=0):
    """q, k, v of `shapes` (fp16) and a boolean key mask over the output's batch dims (one row cut)."""
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(shape, generator=gen).to(DEVICE, torch.float16) for shape in shapes)
    batch = torch.broadcast_shapes(*(s[:-2] for s in shapes))
    # (..., 1, 1, S) over the dims before the heads; rank 3's (B, 1, S) over its batch
    mask_shape = (*batch[:-1], 1, 1, 64) if len(batch) > 1 else (*batch, 1, 64)
    keep = torch.ones(mask_shape, dtype=torch.bool, device=DEVICE)
    keep.view(-1, 64)[-1, 40:] = False
    return q, k, v, keep


@pytest.mark.parametrize("backend", ["auto", "reference"])
@pytest.mark.parametrize("shapes", BROADCASTS.values(), ids=BROADCASTS)
def test_broadcast_batch_and_head_dims_run_in_the_kernels_as_sdpa_broadcasts_them(backend, shapes):
    """SDPA broadcasts every dim before (L, E), heads included (one K/V head serves all query heads
    without enable_gqa); the kernels take these as grouped-query heads or stride-0 views, with the
    very result of the inputs materialized, and SDPA's (fp64) within the quantization error."""
    from sagevideo.attention.functional import TORCH_SDPA

    q, k, v, keep = _broadcast_inputs(shapes)
    out = sagevideo.scaled_dot_product_attention(q, k, v, keep, backend=backend)
    assert not last_backend().is_fallback and last_backend().ran != "sdpa"
    want = TORCH_SDPA(q.double(), k.double(), v.double(), attn_mask=keep)
    assert out.shape == want.shape and error_stats(want, out).cos_worst > _cos_floor(last_backend().pv)
    full = [t.expand(*want.shape[:-2], *t.shape[-2:]).contiguous() for t in (q, k, v)]
    assert torch.equal(out, sagevideo.scaled_dot_product_attention(*full, keep, backend=backend))


@pytest.mark.parametrize("shapes", BROADCASTS.values(), ids=BROADCASTS)
def test_a_broadcast_call_that_falls_back_is_torchs_sdpa_on_the_arguments_as_given(shapes):
    from sagevideo.attention.functional import TORCH_SDPA

    q, k, v, keep = (t.float() if t.is_floating_point() else t for t in _broadcast_inputs(shapes))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = sagevideo.scaled_dot_product_attention(q, k, v, keep)
    assert last_backend().ran == "sdpa" and "float32" in last_backend().reason
    assert torch.equal(out, TORCH_SDPA(q, k, v, attn_mask=keep))


def test_grouped_heads_at_rank_3_and_shapes_sdpa_refuses():
    """Rank 3 with enable_gqa: dim -3 holds the heads that group. Shapes SDPA refuses raise SDPA's
    error under auto and say why for an explicit backend."""
    from sagevideo.attention.functional import TORCH_SDPA

    q, _, _ = _qkv((4, 64, 64), seed=8)
    _, k, v = _qkv((2, 64, 64), seed=9)
    # 16-bit P·V: the 0.999 floor (auto takes FP8 P·V on Hopper, whose floor is 0.998)
    out = sagevideo.scaled_dot_product_attention(q, k, v, enable_gqa=True, backend="reference", pv="fp16")
    assert error_stats(TORCH_SDPA(q.double(), k.double(), v.double(), enable_gqa=True), out).cos_worst > 0.999
    with pytest.raises(RuntimeError):  # SDPA's own error (its wording differs by device)
        sagevideo.scaled_dot_product_attention(q.float(), k.float(), v.float())
    with pytest.raises(ValueError, match=r"backend='reference' cannot run: heads 4, 2, 2 .* do not broadcast"):
        sagevideo.scaled_dot_product_attention(q[None], k[None], v[None], backend="reference")
    with pytest.raises(ValueError, match="backend='triton' cannot run: enable_gqa with 4 query heads, 3 key"):
        sagevideo.scaled_dot_product_attention(q[None], k[None, :1].expand(1, 3, 64, 64), v[None, :1], enable_gqa=True,
                                               backend="triton")


@pytest.mark.slow  # torch.compile
@pytest.mark.parametrize("backend", ["triton", "reference"])
def test_a_broadcast_call_compiles_into_one_graph(backend):
    """One K/V head, a broadcast batch and a key mask: fullgraph=True traces the kernel form (aot_eager;
    the Triton op under the CPU interpreter traces with Dynamo's "eager" only)."""
    q, k, v, keep = _broadcast_inputs(((1, 4, 64, 64), (2, 1, 64, 64), (2, 1, 64, 64)))

    def attend(q, k, v, keep):
        return sagevideo.scaled_dot_product_attention(q, k, v, keep, backend=backend, pv="fp16") * 2

    torch._dynamo.reset()
    interpreted = backend == "triton" and DEVICE == "cpu"
    compiled = torch.compile(attend, fullgraph=True, backend="eager" if interpreted else "aot_eager")
    compiled(q, k, v, keep)  # traced here
    with record_backends() as log:
        out = compiled(q, k, v, keep)
    assert log.counts == {f"{backend}/fp16": 1} and torch.equal(out, attend(q, k, v, keep))


@pytest.mark.parametrize("backend", ["auto", "triton", "reference"])
def test_a_key_mask_with_is_causal_applies_both_as_torchs_fused_kernels_do(backend):
    """SDPA's docs call attn_mask with is_causal=True an error, but torch's fused kernels (CPU flash,
    CUDA efficient and cuDNN) compute it: the causal mask (top-left) and the key mask both apply,
    a row with no valid key gives 0. The kernels take both; where SDPA runs, SDPA decides (its math
    kernel raises)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from sagevideo.attention.functional import TORCH_SDPA

    q, _, _ = _qkv((2, 2, 64, 64), seed=10)
    _, k, v = _qkv((2, 2, 96, 64), seed=11)
    keep = torch.ones(2, 1, 1, 96, dtype=torch.bool, device=DEVICE)
    keep[0, ..., 0] = False  # query row 0 of batch 0 sees no valid key
    keep[1, ..., 40:] = False
    out = sagevideo.scaled_dot_product_attention(q, k, v, keep, is_causal=True, backend=backend)
    assert not last_backend().is_fallback and last_backend().ran != "sdpa"
    want = TORCH_SDPA(q.float(), k.float(), v.float(), attn_mask=keep, is_causal=True)
    assert torch.all(out[0, :, 0] == 0) and torch.all(want[0, :, 0] == 0)
    assert error_stats(want[..., 1:, :], out[..., 1:, :]).cos_worst > _cos_floor(last_backend().pv)
    with sdpa_kernel([SDPBackend.MATH]), pytest.raises(RuntimeError, match="attn_mask should not be set"):
        sagevideo.scaled_dot_product_attention(q.float(), k.float(), v.float(), keep, is_causal=True)
