"""The attention backend registry: one enum, constraint checks that say why, the auto/explicit policy."""

import ast
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import sagevideo
from sagevideo import last_backend
from sagevideo.attention import backends, functional
from sagevideo.attention.backends import AttentionCall, Backend
from sagevideo.kernels import plans

CPU = torch.device("cpu")
CUDA = torch.device("cuda", 0)


@pytest.fixture
def interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")


def test_one_spec_per_backend_and_auto_is_the_policy_not_a_backend():
    assert backends.CHOICES == ("auto", "triton", "reference", "sdpa")
    assert [spec.backend for spec in backends.registered()] == list(Backend)
    assert backends.AUTO not in {b.value for b in Backend}
    assert functional.BACKENDS == backends.CHOICES  # what install/routing validate against
    assert backends.spec("sdpa").constraints == ()  # SDPA computes whatever SDPA computes


@pytest.mark.parametrize(
    "call, reason",
    [
        (AttentionCall(CPU, torch.float32, 64), "dtype torch.float32: the Triton kernels take float16 or bfloat16"),
        (AttentionCall(CPU, torch.float16, 160), "head dim 160 > 128"),
        (AttentionCall(CPU, torch.bfloat16, 64), "bfloat16 under TRITON_INTERPRET"),
        (AttentionCall(CPU, torch.float16, 64, dropout_p=0.5), "dropout_p=0.5: the kernels compute no dropout"),
        (AttentionCall(CPU, torch.float16, 64, shape_problem="rank 2 inputs: ..."), "rank 2 inputs"),
        (AttentionCall(CPU, torch.float16, 64, mask_dtype=torch.float16, mask_shape=(1, 1, 1, 32), n_k=32),
         "attn_mask of dtype torch.float16: only boolean key-padding masks"),
        (AttentionCall(CPU, torch.float16, 64, mask_dtype=torch.bool, mask_shape=(32, 32), n_k=32),
         "attn_mask of shape (32, 32) is not a key-padding mask"),
    ],
    ids=["dtype", "head-dim", "interpreter-bf16", "dropout", "shape", "float-mask", "query-mask"],
)
def test_each_constraint_says_why_the_kernels_cannot_run(interpreter, call, reason):
    assert reason in backends.problem(Backend.TRITON, call)
    assert backends.problem(Backend.SDPA, call) == ""
    chosen, why = backends.choose("auto", call)
    assert chosen is Backend.SDPA and reason in why
    with pytest.raises(ValueError, match=r"backend='triton' cannot run: .*Use backend='auto' to fall back to SDPA"):
        backends.choose("triton", call)


def test_the_reference_takes_any_dtype_device_and_head_dim_but_not_what_only_sdpa_computes(interpreter):
    for call in (AttentionCall(CPU, torch.float32, 64), AttentionCall(CPU, torch.float64, 200),
                 AttentionCall(CPU, torch.bfloat16, 64), AttentionCall(torch.device("meta"), torch.float16, 64)):
        assert backends.choose("reference", call) == (Backend.REFERENCE, "")
    with pytest.raises(ValueError, match="backend='reference' cannot run: dropout_p=0.1"):
        backends.choose("reference", AttentionCall(CPU, torch.float16, 64, dropout_p=0.1))


def test_device_constraints(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    cpu_call = AttentionCall(CPU, torch.float16, 64)
    assert "CPU tensors: the Triton kernels need a CUDA GPU" in backends.problem("triton", cpu_call)
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (8, 0))
    assert backends.problem("triton", AttentionCall(CUDA, torch.float16, 64, pv="fp16")) == ""
    fp8_call = AttentionCall(CUDA, torch.float16, 64, pv="fp8")
    assert "pv='fp8' needs FP8 tensor cores" in backends.problem("triton", fp8_call)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (7, 5))
    assert "compute capability 7.5" in backends.problem("triton", AttentionCall(CUDA, torch.float16, 64))


def test_without_triton_the_kernels_fall_back_and_say_so(interpreter, monkeypatch):
    monkeypatch.setattr(plans, "triton_problem", lambda: "triton is not installed")
    call = AttentionCall(CPU, torch.float16, 64)
    assert backends.choose("auto", call) == (Backend.SDPA, "triton is not installed")
    assert backends.choose("reference", call) == (Backend.REFERENCE, "")


def test_auto_takes_the_kernels_where_every_check_passes(interpreter):
    assert backends.choose("auto", AttentionCall(CPU, torch.float16, 96, pv="fp8")) == (Backend.TRITON, "")
    mask = AttentionCall(CPU, torch.float16, 64, mask_dtype=torch.bool, mask_shape=(2, 1, 1, 40), n_k=40)
    assert backends.choose("auto", mask) == (Backend.TRITON, "")
    assert backends.choose("sdpa", AttentionCall(CPU, torch.float32, 300, dropout_p=0.2)) == (Backend.SDPA, "")


def test_a_misspelt_sm90_kernel_choice_is_an_error_not_a_fallback(monkeypatch):
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    monkeypatch.setenv(plans.SM90_KERNEL_ENV, "glun")
    with pytest.raises(ValueError, match="SAGEVIDEO_SM90_KERNEL='glun'"):
        backends.choose("auto", AttentionCall(CUDA, torch.bfloat16, 128, pv="fp8"))


def test_explicit_sdpa_computes_what_only_sdpa_computes():
    """backend="sdpa" is full-precision SDPA for any SDPA call, value head dims unlike query's too
    (the quantized backends refuse those with their reason)."""
    gen = torch.Generator().manual_seed(0)
    q, k = (torch.randn(1, 2, 16, 64, generator=gen) for _ in range(2))
    v = torch.randn(1, 2, 16, 32, generator=gen)
    out = sagevideo.scaled_dot_product_attention(q, k, v, backend="sdpa")
    assert last_backend().ran == "sdpa" and not last_backend().is_fallback
    assert torch.equal(out, F.scaled_dot_product_attention(q, k, v))
    with pytest.raises(ValueError, match="backend='reference' cannot run: value head dim 32"):
        sagevideo.scaled_dot_product_attention(q, k, v, backend="reference")


def test_the_attention_package_does_not_import_triton():
    """Triton lives in sagevideo.kernels only: the attention package asks `kernels.plans` (which
    imports triton only inside its checks) and calls `kernels.op`."""
    folder = Path(sagevideo.__file__).parent / "attention"
    found = []
    for path in folder.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            found += [f"{path.name}: {name}" for name in names if name.split(".")[0] == "triton"]
    assert found == []


def test_the_backend_choices_are_declared_once():
    """`choices.Backend` (what every room validates against) names exactly "auto" and the registry's backends."""
    from sagevideo import choices
    from sagevideo.attention import backends

    assert set(choices.BACKENDS) == {backends.AUTO, *(b.value for b in backends.Backend)}
    assert backends.CHOICES is choices.BACKENDS
