"""The op boundary (`kernels/op.py`): which op a call reaches, eagerly and inside torch.compile'd
graphs, and that the recorded backend is the kernel the graph calls.

The Gluon sm90 kernel cannot run on CPU (nor under TRITON_INTERPRET), so the CPU tests simulate an
H200: the device's capability and arch are patched to sm90 (the plan names the Gluon kernel, as on
the GPU at head dim 128 with FP8 PV) and the Gluon launch `attention_sm90.attention_forward_sm90` is
replaced by the plain-Triton kernel on the same prepared inputs (interpreted; same tiles, so the same
numbers as the plain path). Everything between `sageattn` and that launch is the real code: plan
selection, `gluon_runs`, the record, `sageattn_triton`, the custom op `sageattn_fwd_gluon` and its
fake. What only the GPU shows (the Gluon kernel itself under Inductor, its output against the eager
call, the recorded label on sm90) is the `gpu` test at the end.
"""

import re

import pytest
import torch

from sagevideo import last_backend, record_backends, sageattn
from sagevideo.kernels import plans
from tests.helpers.hopper import plan_cpu_calls_as_h200

pytestmark = pytest.mark.kernels  # Triton kernels, interpreted on a CPU: make test-fast leaves them out

INTERPRETED = not torch.cuda.is_available()


def _calls(code: str) -> dict[str, int]:
    """How often a graph's code calls each attention op (the Gluon op's name extends the triton_op's)."""
    return {"gluon": len(re.findall(r"sagevideo\.sageattn_fwd_gluon\b", code)),
            "triton": len(re.findall(r"sagevideo\.sageattn_fwd\b", code))}


@pytest.fixture
def simulated_h200(monkeypatch):
    """CPU tensors planned as on an H200 (sm90, the Gluon kernel where "auto" takes it), the Gluon
    launch computed by the plain-Triton kernel; yields the list of launches (one per op run)."""
    if not INTERPRETED:
        pytest.skip("simulates an H200 on CPU under TRITON_INTERPRET (the GPU runs the real kernel)")
    from sagevideo.kernels import attention_fwd, attention_sm90, op  # noqa: F401  (op registers torch.ops.sagevideo)

    plan_cpu_calls_as_h200(monkeypatch)
    launches = []

    def plain_kernel_instead(prepared, out, *, block_n, n_q, n_k, num_stages, tile_lists=None):
        head_dim = prepared.q_codes.shape[-1]
        plan = plans.plain_triton(plans.select_plan(out.device, head_dim, "fp8").plan)
        assert (plan.block_n, num_stages) == (block_n, plans.gluon_stages(head_dim))
        launches.append((tuple(out.shape), n_q, n_k) + (("sparse",) if tile_lists is not None else ()))
        # FP8 PV reads V from the prepared e4m3 copy: `out` only stands in for the 16-bit V pointer
        attention_fwd.attention_forward(prepared, out, None, out, None, plan, is_causal=False, per_token=False,
                                        n_q=n_q, n_k=n_k, tile_lists=tile_lists)

    monkeypatch.setattr(attention_sm90, "attention_forward_sm90", plain_kernel_instead)
    torch._dynamo.reset()
    yield launches
    torch._dynamo.reset()


def _qkv(shape=(1, 2, 150, 128), kv_heads=None, seed=0):
    gen = torch.Generator().manual_seed(seed)
    b, h, n, d = shape
    q = torch.randn(b, h, n, d, generator=gen).half()
    k, v = (torch.randn(b, kv_heads or h, n, d, generator=gen).half() for _ in range(2))
    k[..., 3] += 4.0  # a K channel offset: smoothing matters
    return q, k, v


class _Graphs:
    """A torch.compile backend that keeps the code of each graph it compiles: Dynamo's graph
    ("eager", "inductor") or AOT autograd's ATen graph ("aot_eager"), then runs it as that backend
    would."""

    def __init__(self, kind: str):
        self.kind = kind
        self.code: list[str] = []

    def __call__(self, gm, example_inputs):
        if self.kind == "eager":
            self.code.append(gm.code)
            return gm.forward
        if self.kind == "inductor":
            from torch._inductor.compile_fx import compile_fx

            self.code.append(gm.code)
            return compile_fx(gm, example_inputs)
        from functorch.compile import make_boxed_func
        from torch._dynamo.backends.common import aot_autograd

        def keep(aten_gm, inputs):
            self.code.append(aten_gm.code)
            return make_boxed_func(aten_gm.forward)

        return aot_autograd(fw_compiler=keep)(gm, example_inputs)


def _compiled(fn, kind):
    from torch._dynamo.utils import counters

    counters.clear()
    graphs = _Graphs(kind)
    return torch.compile(fn, fullgraph=True, backend=graphs), graphs


def test_eager_calls_on_h200_run_the_gluon_op_and_record_gluon(simulated_h200, monkeypatch):
    q, k, v = _qkv()
    out = sageattn(q, k, v, pv="fp8")
    assert last_backend().label == "gluon/fp8" and simulated_h200 == [((1, 2, 150, 128), 150, 150)]
    monkeypatch.setenv(plans.SM90_KERNEL_ENV, "triton")
    plain = sageattn(q, k, v, pv="fp8")
    assert last_backend().label == "triton/fp8" and len(simulated_h200) == 1  # the triton_op, not the Gluon op
    assert torch.equal(out, plain)  # the plain kernel stands in for the Gluon one on the same preparation


@pytest.mark.slow  # torch.compile
@pytest.mark.parametrize("kind", ["eager", "aot_eager", "inductor"])
@pytest.mark.parametrize("layout", ["HND", "NHD"])
def test_compiled_graphs_call_the_gluon_op_and_record_what_they_call(simulated_h200, kind, layout):
    """Under torch.compile the Gluon kernel's plan is taken as eagerly: one graph, no break, the opaque
    Gluon op in it (not the triton_op; under Inductor an extern call in the generated code), the
    record op saying "gluon" each time the graph runs, and the eager call's output (same kernels)."""
    from torch._dynamo.utils import counters
    from torch._inductor.utils import run_and_get_code

    q, k, v = _qkv()
    if layout == "NHD":  # token-major views of the same tensors, as diffusers' processors pass them
        q, k, v = (t.transpose(1, 2).contiguous() for t in (q, k, v))

    def attend(q, k, v):
        return sageattn(q, k, v, pv="fp8", tensor_layout=layout, backend="triton") * 2

    eager = attend(q, k, v)
    assert last_backend().label == "gluon/fp8" and len(simulated_h200) == 1
    compiled, graphs = _compiled(attend, kind)
    first, generated = run_and_get_code(compiled, q, k, v)  # traced here
    if kind == "inductor":
        assert any("torch.ops.sagevideo.sageattn_fwd_gluon.default(" in src for src in generated), generated
    with record_backends() as log:
        again = [compiled(q, k, v) for _ in range(2)]
    assert dict(counters["graph_break"]) == {}, dict(counters["graph_break"])
    assert len(graphs.code) == 1
    code = graphs.code[0]
    assert _calls(code) == {"gluon": 1, "triton": 0}, code
    assert "sagevideo.record_backend" in code and "'gluon'" in code
    assert log.counts == {"gluon/fp8": 2}  # each run of the graph reports the kernel it calls
    assert len(simulated_h200) == 4  # and runs it: the eager call, then three runs of the compiled graph
    for out in (first, *again):
        assert out.shape == eager.shape and out.stride() == eager.stride()
        assert torch.equal(out, eager)


@pytest.mark.slow  # torch.compile
def test_calls_the_gluon_kernel_does_not_take_compile_to_the_triton_op(simulated_h200):
    """A causal call, a key mask or the LSE: the plain-Triton kernel, in the graph and in the record
    (the triton_op under the interpreter traces with Dynamo's "eager" only)."""
    q, k, v = _qkv((1, 2, 100, 128))
    mask = torch.ones(1, 1, 1, 100, dtype=torch.bool)
    mask[..., 80:] = False

    def attend(q, k, v):
        causal = sageattn(q, k, v, pv="fp8", is_causal=True)
        masked, lse = sageattn(q, k, v, pv="fp8", attn_mask=mask, return_lse=True)
        plain = sageattn(q, k, v, pv="fp8")
        return causal + masked + plain, lse

    compiled, graphs = _compiled(attend, "eager")
    compiled(q, k, v)
    with record_backends() as log:
        compiled(q, k, v)
    assert log.counts == {"triton/fp8": 2, "gluon/fp8": 1}
    assert _calls(graphs.code[0]) == {"gluon": 1, "triton": 2}, graphs.code[0]


@pytest.mark.parametrize("layout, kv_heads", [("HND", None), ("NHD", None), ("HND", 1)],
                         ids=["hnd", "nhd-views", "grouped-kv"])
def test_the_gluon_op_fake_matches_the_op(simulated_h200, layout, kv_heads):
    """`torch.library.opcheck`: schema, fake (output shape, dtype and strides, here for HND tensors,
    NHD-strided views and fewer K/V heads) and AOT dispatch agree with the op's real output."""
    from sagevideo.kernels.rotation import hadamard_pm1

    q, k, v = _qkv((1, 2, 70, 128), kv_heads=kv_heads)
    if layout == "NHD":
        q, k, v = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v))
    plan = plans.select_plan(q.device, 128, "fp8").plan
    assert plan.kernel == "gluon"
    args = (q, k, v, hadamard_pm1(128, q.device, q.dtype), 128**-0.5, True, plan.pv, plan.arch, plan.block_d,
            plan.block_m, plan.block_n, plan.num_warps, plan.num_stages)
    torch.library.opcheck(torch.ops.sagevideo.sageattn_fwd_gluon.default, args,
                          test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_dynamic"))
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        fake, fake_flagged = torch.ops.sagevideo.sageattn_fwd_gluon(
            *(mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args))
    real, real_flagged = torch.ops.sagevideo.sageattn_fwd_gluon(*args)
    assert (fake.shape, fake.stride(), fake.dtype) == (real.shape, real.stride(), real.dtype) == (
        q.shape, q.stride(), q.dtype)
    assert (fake_flagged.shape, fake_flagged.dtype) == (real_flagged.shape, real_flagged.dtype) == ((), torch.int32)


@pytest.mark.parametrize("given", ["mask", "selection"])
def test_sparse_calls_on_h200_run_the_gluon_op_on_their_lists(simulated_h200, monkeypatch, given):
    """A tile mask, or a selection the call makes (`sageattn_fwd_select_gluon`): the Gluon kernel takes
    the lists (recorded "gluon", the density too) and computes what the plain kernel computes on them;
    a query tile that visits nothing gives 0."""
    from sagevideo.attention.sparse import TileMask
    from sagevideo.kernels.tile_select import DynamicSelection

    q, k, v = _qkv((1, 2, 256, 128), seed=4)
    keep = torch.rand(1, 2, 4, 2, generator=torch.Generator().manual_seed(1)) < 0.6  # 64x128 tiles
    keep[0, 0, 1] = False  # query tile 1 of head 0 visits none
    keep[..., 2:, 1] = True
    selection = DynamicSelection(density=0.25, sink_tiles=0, local_tiles=0, min_similarity=0.0)
    tile_mask = TileMask(keep, 64, 128, 256, 256) if given == "mask" else selection
    out = sageattn(q, k, v, tile_mask=tile_mask, pv="fp8")
    choice = last_backend()
    assert choice.label == "gluon/fp8" and simulated_h200 == [((1, 2, 256, 128), 256, 256, "sparse")]
    monkeypatch.setenv(plans.SM90_KERNEL_ENV, "triton")
    plain = sageattn(q, k, v, tile_mask=tile_mask, pv="fp8")
    assert last_backend().label == "triton/fp8" and len(simulated_h200) == 1
    assert torch.equal(out, plain)  # the plain kernel stands in for the Gluon one on the same lists
    assert choice.density == last_backend().density < 1
    if given == "mask":
        assert choice.density == pytest.approx(float(keep.float().mean()))
        assert (out[:, 0, 64:128] == 0).all() and (out[:, 1, 64:128] != 0).any()


@pytest.mark.slow  # torch.compile
@pytest.mark.parametrize("given", ["mask", "selection"])
def test_a_compiled_sparse_call_on_h200_is_one_graph_calling_the_gluon_op(simulated_h200, given):
    """torch.compile (aot_eager, fullgraph) of a sparse call: one graph, no break, the Gluon op (with
    lists, or the one that selects) in it, recorded "gluon", the eager call's output."""
    from torch._dynamo.utils import counters

    from sagevideo.attention.sparse import TileMask
    from sagevideo.kernels.tile_select import DynamicSelection

    q, k, v = _qkv((1, 2, 256, 128), seed=5)
    keep = torch.ones(1, 1, 4, 2, dtype=torch.bool)
    keep[..., 0, 1] = False
    tile_mask = (TileMask(keep, 64, 128, 256, 256) if given == "mask"
                 else DynamicSelection(density=0.25, sink_tiles=0, local_tiles=0, min_similarity=0.0))

    def attend(q, k, v):
        return sageattn(q, k, v, tile_mask=tile_mask, pv="fp8") * 2

    eager = attend(q, k, v)
    compiled, graphs = _compiled(attend, "aot_eager")
    with record_backends() as log:
        out = compiled(q, k, v)
    assert dict(counters["graph_break"]) == {} and len(graphs.code) == 1
    op = "sageattn_fwd_gluon" if given == "mask" else "sageattn_fwd_select_gluon"
    assert f"sagevideo.{op}" in graphs.code[0] and "sagevideo.sageattn_fwd." not in graphs.code[0]
    assert log.counts == {"gluon/fp8": 1} and all(launch[-1] == "sparse" for launch in simulated_h200)
    assert torch.equal(out, eager)


@pytest.mark.parametrize("op", ["lists", "select"])
def test_the_sparse_gluon_ops_fakes_match_the_ops(simulated_h200, op):
    """`torch.library.opcheck` of the Gluon op with tile lists and of `sageattn_fwd_select_gluon`:
    schema, fake (shapes, dtypes, strides of the output and the lists) and AOT dispatch agree."""
    from sagevideo.kernels.rotation import hadamard_pm1

    q, k, v = _qkv((1, 1, 200, 128))
    plan = plans.select_plan(q.device, 128, "fp8").plan
    args = (q, k, v, hadamard_pm1(128, q.device, q.dtype), 128**-0.5, True, plan.pv, plan.arch, plan.block_d,
            plan.block_m, plan.block_n, plan.num_warps, plan.num_stages)
    if op == "lists":
        keep = torch.ones(1, 1, 4, 2, dtype=torch.bool)
        keep[..., 0, 1] = False
        counts = keep.sum(dim=-1, dtype=torch.int32)
        lists = torch.tensor([[0, -1], [0, 1], [0, 1], [0, 1]], dtype=torch.int32)[None, None]
        target, args = torch.ops.sagevideo.sageattn_fwd_gluon.default, (*args, lists, counts)
    else:
        target = torch.ops.sagevideo.sageattn_fwd_select_gluon.default
        args = (*args, 0.9, 1, 1, 0.5, 0, 0, float("inf"), 0.5, 0)
    torch.library.opcheck(target, args, test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_dynamic"))
    assert all(launch[-1] == "sparse" for launch in simulated_h200) and simulated_h200


def test_a_gluon_plan_for_a_call_it_does_not_take_is_refused(simulated_h200):
    """The op a Gluon plan reaches takes no mask, causal, per-token or LSE arguments: `sageattn_triton`
    refuses such a call instead of running another kernel than the one recorded."""
    from sagevideo.kernels.op import sageattn_triton

    q, k, v = _qkv((1, 1, 64, 128))
    plan = plans.select_plan(q.device, 128, "fp8").plan
    with pytest.raises(ValueError, match="a Gluon plan for a call the Gluon kernel does not take"):
        sageattn_triton(q, k, v, plan, sm_scale=0.1, is_causal=True, key_mask=None, per_token=False, smooth_k=True,
                        rotate_qk=True, return_lse=False)
    with pytest.raises(ValueError, match="sageattn_fwd runs the plain-Triton kernel, not kernel='gluon'"):
        torch.ops.sagevideo.sageattn_fwd(q, k, v, None, None, 0.1, False, False, True, False, *(
            plan.pv, plan.arch, plan.block_d, plan.block_m, plan.block_n, plan.num_warps, plan.num_stages, "gluon",
            False, 0))
    assert simulated_h200 == []


# ---- on the H200 -------------------------------------------------------------------------------

def _on_hopper() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


@pytest.mark.gpu
@pytest.mark.skipif(not _on_hopper(), reason="needs an sm90 GPU")
@pytest.mark.parametrize("layout", ["HND", "NHD"])
def test_inductor_runs_the_gluon_kernel_on_h200(monkeypatch, layout):
    """torch.compile (Inductor, fullgraph) of a function calling `sageattn` at head dim 128 with FP8 PV
    on the H200 (the plan's default: SAGEVIDEO_SM90_KERNEL=auto takes the Gluon kernel there): the
    graph calls the Gluon op, the records say gluon/fp8 on every run, and the output is the eager
    call's, bit for bit (the same two ops run on the same inputs; `* 2` is exact)."""
    from torch._dynamo.utils import counters
    from torch._inductor.compile_fx import compile_fx

    monkeypatch.delenv(plans.SM90_KERNEL_ENV, raising=False)
    gen = torch.Generator("cuda").manual_seed(3)
    shape = (2, 8, 3000, 128) if layout == "HND" else (2, 3000, 8, 128)
    q, k, v = (torch.randn(shape, device="cuda", generator=gen).to(torch.bfloat16) for _ in range(3))

    def attend(q, k, v):
        return sageattn(q, k, v, pv="fp8", tensor_layout=layout) * 2

    eager = attend(q, k, v)
    assert last_backend().label == "gluon/fp8"
    codes = []

    def inductor_keeping_the_graph(gm, example_inputs):
        codes.append(gm.code)
        return compile_fx(gm, example_inputs)

    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(attend, fullgraph=True, backend=inductor_keeping_the_graph)
    first = compiled(q, k, v)
    with record_backends() as log:
        again = compiled(q, k, v)
        compiled(q, k, v)
    torch.cuda.synchronize()
    assert dict(counters["graph_break"]) == {}
    assert len(codes) == 1 and _calls(codes[0]) == {"gluon": 1, "triton": 0}, codes
    assert log.counts == {"gluon/fp8": 2}, log.counts
    for out in (first, again):
        assert out.shape == eager.shape and out.stride() == eager.stride()
        assert torch.isfinite(out).all()
        assert torch.equal(out, eager), (out.float() - eager.float()).abs().max().item()
    monkeypatch.setenv(plans.SM90_KERNEL_ENV, "triton")  # the plain kernel: the same numbers up to rounding
    plain = attend(q, k, v)
    assert last_backend().label == "triton/fp8"
    assert (plain.float() - eager.float()).abs().max().item() <= 16e-3
    torch._dynamo.reset()
