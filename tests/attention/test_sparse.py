"""Block-sparse calls through `sageattn(tile_mask=...)` (`attention/sparse.py`): every backend computes
the mask as the reference defines it, masks that do not fit are refused before any launch, density 1
runs dense, the records carry the density, and a Gluon plan's sparse call runs the plain kernel with
its reason. (The kernel itself: tests/kernels/test_attention_fwd_sparse.py.)"""

import math

import pytest
import torch

from sagevideo import last_backend, record_backends, sageattn
from sagevideo.attention.accuracy import error_stats
from sagevideo.eval.numerics.presets import make_inputs
from sagevideo.kernels import plans
from sagevideo.kernels.sparse_reference import TileMask, masked_attention_exact, sparse_sageattn_reference

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
N = 200  # partial last tiles in every plan's tiles


def _qkv(shape=(1, 2, N, 64), dtype=torch.float16, seed=0, preset="k-offset"):
    x = make_inputs(preset, shape, seed)
    return tuple(t.to(DEVICE, dtype) for t in (x.q, x.k, x.v))


def _coarse_mask(heads=2, n=N, seed=0):
    """128x128 tiles (both plans' tiles divide them): heads of different densities, head 0's last query
    tile visiting nothing."""
    gen = torch.Generator().manual_seed(seed)
    tiles = math.ceil(n / 128)
    keep = torch.rand(1, heads, tiles, tiles, generator=gen) < torch.linspace(0.3, 0.9, heads)[None, :, None, None]
    keep[:, :, 0, 0] = True
    keep[:, 0, -1] = False
    return TileMask(keep.to(DEVICE), 128, 128, n, n)


def test_the_kernel_computes_the_sparse_reference_and_records_the_density():
    """A coarse mask refined at the boundary to the plan's 128x64 tiles; NHD layout; LSE."""
    q, k, v = _qkv()
    mask = _coarse_mask()
    nhd = [t.transpose(1, 2).contiguous() for t in (q, k, v)]
    out, lse = sageattn(*nhd, tensor_layout="NHD", tile_mask=mask.to_lists(), backend="triton", return_lse=True)
    choice = last_backend()
    assert (choice.label, choice.density) == ("triton/fp16", pytest.approx(mask.density))
    ref, ref_lse = sparse_sageattn_reference(q, k, v, mask.at_tiles(*plans.tiles("fp16", 64)), rotate_qk=True,
                                             return_lse=True)
    out = out.transpose(1, 2)
    assert torch.equal(torch.isinf(lse), torch.isinf(ref_lse)) and (out[:, 0, 128:] == 0).all()
    assert (out.float() - ref.float()).abs().max() < 2e-3
    assert (lse - ref_lse)[torch.isfinite(ref_lse)].abs().max() < 1e-3


def test_the_reference_backend_runs_the_sparse_reference():
    q, k, v = _qkv(seed=1)
    mask = _coarse_mask(seed=1)
    out = sageattn(q, k, v, tile_mask=mask, backend="reference", pv="fp8")
    assert last_backend().label == "reference/fp8" and last_backend().density == pytest.approx(mask.density)
    want, _ = sparse_sageattn_reference(q, k, v, mask.at_tiles(*plans.tiles("fp8", 64)), pv="fp8", rotate_qk=True)
    assert torch.equal(out, want)


@pytest.mark.parametrize("case", ["fp32-inputs", "float-mask", "causal", "grouped-kv"])
def test_the_sdpa_fallback_computes_the_mask_not_dense_attention(case):
    """backend="auto" falls back to SDPA (fp32 inputs, or a float mask the kernels do not take): the tile
    mask's token mask with any attention mask and causality, rows left without a key 0 with LSE -inf,
    against exact masked attention."""
    heads = 4 if case == "grouped-kv" else 2
    q, k, v = _qkv((1, heads, N, 64), dtype=torch.float32, seed=2)
    mask = _coarse_mask(heads, seed=2)
    kw, exact_kw = {}, {}
    if case == "float-mask":
        q, k, v = (t.half() for t in (q, k, v))
        bias = torch.zeros(1, 1, 1, N, device=DEVICE, dtype=torch.float16)
        bias[..., 150:] = float("-inf")  # key padding, spelled as an additive mask
        kw["attn_mask"], exact_kw["key_mask"] = bias, torch.isfinite(bias[0, 0])
    if case == "causal":
        kw["is_causal"] = exact_kw["is_causal"] = True
    if case == "grouped-kv":
        k, v = k[:, :2].contiguous(), v[:, :2].contiguous()
        kw["enable_gqa"] = True
    out, lse = sageattn(q, k, v, tile_mask=mask, return_lse=True, **kw)
    assert last_backend().ran == "sdpa" and last_backend().is_fallback
    assert last_backend().density == pytest.approx(mask.density)
    k_all, v_all = (t.repeat_interleave(heads // t.shape[1], dim=1) for t in (k, v))
    exact, exact_lse = masked_attention_exact(q, k_all, v_all, mask, return_lse=True, **exact_kw)
    keyless = torch.isinf(exact_lse)
    assert keyless.any() and torch.equal(torch.isinf(lse), keyless) and (out[keyless] == 0).all()
    assert (out.double() - exact).abs().max() < (2e-3 if out.dtype == torch.float16 else 1e-5)


def test_density_one_runs_the_dense_kernel(monkeypatch):
    from sagevideo.kernels import attention_fwd

    q, k, v = _qkv(seed=3)
    dense = sageattn(q, k, v, backend="triton")
    monkeypatch.setattr(attention_fwd, "_launch_sparse", lambda *a, **kw: pytest.fail("the sparse launch ran"))
    full = TileMask.full(1, 1, N, N, 128, 128, device=DEVICE)
    assert torch.equal(sageattn(q, k, v, tile_mask=full, backend="triton"), dense)
    assert last_backend().density == 1.0


def test_a_ready_mask_is_not_read_on_the_host_and_its_record_still_has_the_density(monkeypatch):
    """Lists made on the device and a mask whose density nobody stated: the call neither reads them
    on the host (a sync per call leaves the device idle while the next call is prepared: 3.7 ms a
    call at Wan's shape on an H100) nor loses the density, which the record takes on the device."""
    from sagevideo.attention import records
    from sagevideo.attention.sparse import select_tile_lists
    from sagevideo.kernels.tile_select import DynamicSelection

    q, k, v = _qkv(seed=5)
    lists = select_tile_lists(q, k, DynamicSelection(top_p=0.5), pv="fp16", sm_scale=0.125)
    mask = _coarse_mask()

    def refuse(self, *args, **kwargs):
        raise AssertionError("a host read in a sparse call")

    with record_backends() as log:
        for tile_mask in (lists, mask):
            records.read_direct_counts(wait_for=-1)  # earlier calls' guard counts: read one call behind
            for name in ("item", "__bool__", "__int__", "__float__", "__index__", "tolist"):
                monkeypatch.setattr(torch.Tensor, name, refuse)
            sageattn(q, k, v, pv="fp16", sm_scale=0.125, tile_mask=tile_mask, backend="triton")
            monkeypatch.undo()
    assert [choice.density for choice in log.choices] == pytest.approx([lists.density, mask.density])


def test_full_and_static_masks_know_their_density_without_reading_it():
    """`TileMask.full` and the static selection (made on the host) carry their density, so that a full
    mask runs the dense kernel without a host read; a mask built from a tensor does not claim one."""
    from sagevideo.attention.sparse import select_tiles

    full = TileMask.full(1, 2, N, N, 128, 128, device=DEVICE)
    assert full.known_density == 1.0 and full.expand(1, 2).known_density == 1.0
    assert _coarse_mask().known_density is None
    with pytest.raises(TypeError):  # a caller cannot claim one: nothing would check it
        TileMask(_coarse_mask().keep, 128, 128, N, N, known_density=1.0)
    q, k, _ = _qkv((1, 2, 4 * 16 * 32, 64))
    static = select_tiles(q, k, method="static", density=0.25, pv="fp8", grid=(4, 16, 32))
    assert static.known_density == pytest.approx(static.density) and static.known_density < 1


def _masks_that_do_not_fit():
    ok = _coarse_mask()
    return [
        pytest.param(ok.keep, TypeError, "tile_mask must be a TileMask or TileLists", id="not-a-mask"),
        pytest.param(TileMask.full(1, 2, 256, N, 128, 128, device=DEVICE), ValueError,
                     f"built for 256 query / {N} key tokens, the inputs have {N} / {N}", id="lengths"),
        pytest.param(TileMask.full(1, 3, N, N, 128, 128, device=DEVICE), ValueError,
                     r"\(B, H\) = \(1, 3\) does not broadcast", id="heads"),
        pytest.param(TileMask.full(1, 2, N, N, 96, 128, device=DEVICE).to_lists(), ValueError,
                     "built in 96x128 tiles, but this call's kernel plan computes in 128x64", id="tiles"),
        pytest.param(TileMask(ok.keep.to("meta"), 128, 128, N, N), ValueError, "tile_mask is on meta", id="device"),
    ]


@pytest.mark.parametrize("backend", ["triton", "reference"])
@pytest.mark.parametrize("mask, error, message", _masks_that_do_not_fit())
def test_masks_that_do_not_fit_the_call_are_refused_before_any_launch(monkeypatch, backend, mask, error, message):
    from sagevideo.kernels import op, reference

    monkeypatch.setattr(op, "quantize_inputs", lambda *a, **kw: pytest.fail("the preparation ran"))
    monkeypatch.setattr(reference, "sageattn_reference", lambda *a, **kw: pytest.fail("the reference ran"))
    q, k, v = _qkv()
    with record_backends() as log, pytest.raises(error, match=message):
        sageattn(q, k, v, tile_mask=mask, backend=backend)
    assert log.choices == []  # nothing recorded: nothing ran


@pytest.mark.slow  # torch.compile
@pytest.mark.parametrize("given", ["lists", "per-row density"])
def test_a_compiled_sparse_call_is_one_graph_and_records_an_unread_density(given):
    """torch.compile(fullgraph=True): the lists go into the op, or the call selects at a per-row density
    inside its op, with no host read (the density is not read in a graph: recorded NaN), the same
    output as the eager call."""
    from torch._dynamo.utils import counters

    from sagevideo.kernels.tile_select import DynamicSelection

    q, k, v = _qkv(seed=5)
    lists = _coarse_mask(seed=5).to_lists() if given == "lists" else DynamicSelection(density=0.4, min_similarity=0)

    def attend(q, k, v):
        return sageattn(q, k, v, tile_mask=lists, backend="triton") * 2

    eager = attend(q, k, v)
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(attend, fullgraph=True, backend="eager" if DEVICE == "cpu" else "inductor")
    with record_backends() as log:
        out = compiled(q, k, v)
    assert dict(counters["graph_break"]) == {}
    assert torch.equal(out, eager)
    assert [c.label for c in log.choices] == ["triton/fp16"] and math.isnan(log.choices[0].density)
    torch._dynamo.reset()


# ---- calls that select their own tiles (DynamicSelection) ---------------------------------------


def _structured(heads=2, n=384, seed=0, dtype=torch.float16):
    """q, k, v whose 128-query / 64-key tiles are self-similar and where each query tile attends two key
    tiles most (the fp16 plan's tiles at d64)."""
    gen = torch.Generator().manual_seed(seed)
    centres = torch.randn(heads, n // 64, 64, generator=gen)
    picks = torch.randint(0, n // 64, (heads, n // 128, 2), generator=gen)
    q = torch.stack([centres[h][picks[h]].sum(dim=1) for h in range(heads)]).repeat_interleave(128, dim=1)
    k = centres.repeat_interleave(64, dim=1)
    q, k = (t[None] + 0.3 * torch.randn(1, heads, n, 64, generator=gen) for t in (q, k))
    v = torch.randn(1, heads, n, 64, generator=gen)
    return tuple(t.to(DEVICE, dtype) for t in (q, k, v))


@pytest.mark.parametrize("rule", ["top_p", "per-row density"])
def test_a_dynamic_selection_selects_and_attends_in_one_triton_call(rule):
    """sageattn(tile_mask=DynamicSelection): the kernels select inside the preparation; the output is
    the one of the same call with the lists `select_tile_lists` makes (the same pooling, the same lists); the
    record's density is read once after the call (eagerly; a compiled graph's is NaN)."""
    from sagevideo.attention.sparse import select_tile_lists
    from sagevideo.kernels.tile_select import DynamicSelection

    q, k, v = _structured()
    key_mask = torch.ones(1, 1, 1, 384, dtype=torch.bool, device=DEVICE)
    key_mask[..., 350:] = False
    selection = DynamicSelection(sink_tiles=0, **({"top_p": 0.5} if rule == "top_p" else {"density": 0.3}))
    out, lse = sageattn(q, k, v, tile_mask=selection, attn_mask=key_mask, backend="triton", return_lse=True)
    choice = last_backend()
    lists = select_tile_lists(q, k, selection, key_mask=key_mask[:, 0, 0])
    assert choice.label == "triton/fp16" and choice.density == pytest.approx(lists.density)
    assert 0 < lists.density < 1 and not lists.check_entries
    want, want_lse = sageattn(q, k, v, tile_mask=lists, attn_mask=key_mask, backend="triton", return_lse=True)
    assert last_backend().density == pytest.approx(lists.density)
    assert torch.equal(out, want) and torch.equal(lse, want_lse)


@pytest.mark.parametrize("rule", ["top_p", "per-row density"])
@pytest.mark.parametrize("backend", ["reference", "sdpa"])
def test_the_other_backends_select_with_the_pytorch_definition(backend, rule):
    """The reference and SDPA take the PyTorch selection (`TileScores`) in the plan's tiles: the same as
    passing its mask; `select_tile_lists` without the kernels (fp32 inputs) gives its lists."""
    from sagevideo.attention.sparse import select_tile_lists
    from sagevideo.kernels.tile_select import DynamicSelection, select_dynamic, select_dynamic_per_row

    q, k, v = _structured(seed=1, dtype=torch.float16 if backend == "reference" else torch.float32)
    if rule == "top_p":
        selection = DynamicSelection(top_p=0.5, sink_tiles=0)
        mask = select_dynamic(q, k, block_m=128, block_n=64, **{"top_p": 0.5, **selection.scores_options()})
    else:
        selection = DynamicSelection(density=0.3, sink_tiles=0)
        mask = select_dynamic_per_row(q, k, 0.3, block_m=128, block_n=64, **selection.scores_options())
    assert 0 < mask.density < 1
    out = sageattn(q, k, v, tile_mask=selection, backend=backend)
    assert last_backend().ran == backend and last_backend().density == pytest.approx(mask.density)
    assert torch.equal(out, sageattn(q, k, v, tile_mask=mask, backend=backend))
    lists = select_tile_lists(q.float(), k.float(), selection)
    assert torch.equal(lists.to_mask().keep, mask.keep)


def test_a_dynamic_selection_takes_only_a_key_padding_mask_and_text_that_fits():
    from sagevideo.kernels.tile_select import DynamicSelection

    q, k, v = _structured()
    bias = torch.zeros(1, 1, 384, 384, device=DEVICE, dtype=torch.float16)
    with pytest.raises(ValueError, match="takes no attn_mask but a boolean key-padding one"):
        sageattn(q, k, v, tile_mask=DynamicSelection(), attn_mask=bias)
    with pytest.raises(ValueError, match="exceed the sequence"):
        sageattn(q, k, v, tile_mask=DynamicSelection(dense_prefix=400))


# ---- on the GPU ---------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("pv", ["fp16", "fp8"])
def test_sparse_calls_meet_the_contract_on_gpu(pv, head_dim):
    """sageattn(tile_mask=...) at 1x4x4096 against exact masked attention: the dense floors, worst head;
    on Hopper the FP8 d128 call runs the Gluon kernel (its plan's), recorded so."""
    from sagevideo.kernels.dispatch import kernel_for

    shape = (1, 4, 4096, head_dim)
    q, k, v = _qkv(shape, seed=6)
    mask = _coarse_mask(4, 4096, seed=6)
    out = sageattn(q, k, v, tile_mask=mask, pv=pv, backend="triton")
    choice = last_backend()
    assert choice.ran == kernel_for(q.device, head_dim, pv).kernel and choice.density == pytest.approx(mask.density)
    stats = error_stats(masked_attention_exact(q, k, v, mask), out)
    assert stats.nonfinite == 0 and stats.cos_worst >= {"fp16": 0.999, "fp8": 0.998}[pv], stats


# --- the SDPA-signature call and tile selection for installed models (issue 36 stage 4a) ---


@pytest.mark.parametrize("backend", ["reference", "sdpa"])
def test_the_sdpa_signature_call_computes_the_tile_mask_as_sageattn(backend):
    from sagevideo.attention.functional import scaled_dot_product_attention

    q, k, v = (t.float() if backend == "sdpa" else t for t in _qkv(seed=2))
    mask = _coarse_mask(seed=2)
    with record_backends() as log:
        got = scaled_dot_product_attention(q, k, v, backend=backend, pv="fp16", tile_mask=mask)
        want = sageattn(q, k, v, backend=backend, pv="fp16", tile_mask=mask)
    assert torch.equal(got, want)
    assert [c.density for c in log.choices] == [pytest.approx(mask.density)] * 2
    if backend == "sdpa":  # full precision restricted to the mask, not dense attention
        assert not torch.allclose(got, sageattn(q, k, v, backend="sdpa"), atol=1e-3)


@pytest.mark.parametrize("backend", ["reference", "sdpa"])
def test_the_sdpa_signature_call_takes_a_dynamic_selection_on_every_backend(backend):
    """A `DynamicSelection` (what installed dynamic calls pass) where SDPA computes the call selects with
    the PyTorch definition, as sageattn does; a mask that is not key padding is refused with it."""
    from sagevideo.attention.functional import scaled_dot_product_attention
    from sagevideo.kernels.tile_select import DynamicSelection

    q, k, v = (t.float() if backend == "sdpa" else t for t in _qkv(seed=2))
    selection = DynamicSelection(top_p=0.5, min_similarity=-1.0)
    with record_backends() as log:
        got = scaled_dot_product_attention(q, k, v, backend=backend, pv="fp16", tile_mask=selection)
        want = sageattn(q, k, v, backend=backend, pv="fp16", tile_mask=selection)
    assert torch.equal(got, want) and log.choices[0].density == pytest.approx(log.choices[1].density)
    assert 0 < log.choices[0].density < 1
    causal = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool).tril()
    with pytest.raises(ValueError, match="DynamicSelection tile_mask takes no attn_mask but a boolean key-padding"):
        scaled_dot_product_attention(q, k, v, causal, backend="sdpa", pv="fp16", tile_mask=selection)


def test_a_call_that_cannot_be_sparse_is_refused_not_run_dense():
    from sagevideo.attention.functional import scaled_dot_product_attention

    q, k, v = _qkv(seed=3)
    with pytest.raises(ValueError, match="cannot be block-sparse .*dropout_p=0.5"):
        scaled_dot_product_attention(q, k, v, dropout_p=0.5, tile_mask=_coarse_mask())


def test_select_tiles_keeps_text_dense_in_the_plan_tiles_and_caches_static_masks():
    """Static on the grid, dynamic on planted structure (random q/k are not self-similar per tile,
    so the dynamic selection keeps everything there: pooling would misjudge them)."""
    from sagevideo.attention.sparse import select_tiles
    from sagevideo.eval.numerics.planted import PlantedSpec, planted_inputs
    from sagevideo.kernels.tile_select import forced_tiles

    grid, text = (3, 16, 16), 40
    n = text + math.prod(grid)
    x = planted_inputs(PlantedSpec(batch=1, heads=2, frames=3, height=16, width=16, head_dim=64, text_prefix=text,
                                   global_tokens=0))
    q, k = x.q, x.k
    static = select_tiles(q, k, method="static", density=0.2, pv="fp8", text_last=text, grid=grid)
    assert (static.block_m, static.block_n) == plans.tiles("fp8", 64) and static.keep.shape[:2] == (1, 1)
    again = select_tiles(q, k, method="static", density=0.2, pv="fp8", text_last=text, grid=grid)
    assert again.keep is static.keep  # one selection per setting: it depends on no input
    dynamic = select_tiles(q, k, method="dynamic", density=0.3, pv="fp16", text_first=text)
    assert (dynamic.block_m, dynamic.block_n) == plans.tiles("fp16", 64) and dynamic.keep.shape[:2] == (1, 2)
    for mask, first, last in ((static, 0, text), (dynamic, text, 0)):
        assert 0 < mask.density < 1
        forced = forced_tiles(n, n, mask.block_m, mask.block_n, dense_prefix=first, dense_suffix=last)
        assert mask.keep[:, :, forced].all()  # text rows and columns, and the diagonal
    with pytest.raises(ValueError, match="do not make the call's"):
        select_tiles(q, k, method="static", density=0.2, pv="fp8", grid=grid)
    with pytest.raises(ValueError, match="needs the latent grid"):
        select_tiles(q, k, method="static", density=0.2, pv="fp8")


def test_static_mask_is_select_tiles_static_rule_at_the_tiles_asked():
    """A video-only call: the same keep as select_tiles' static mask at the plan's tiles; other tiles
    give the same window's rule at their size (bench attention's 128x128 masks)."""
    from sagevideo.attention.sparse import select_tiles, static_mask
    from sagevideo.kernels.tile_select import select_static_at_density

    grid = (3, 16, 16)
    q = k = torch.zeros(1, 2, math.prod(grid), 64)
    selected = select_tiles(q, k, method="static", density=0.25, pv="fp8", grid=grid)
    mask = static_mask(grid, 0.25, block_m=selected.block_m, block_n=selected.block_n)
    assert torch.equal(mask.keep, selected.keep) and (mask.n_q, mask.n_k) == (768, 768)
    wide = static_mask(grid, 0.25, block_m=128, block_n=128)
    expected, _ = select_static_at_density(grid, 0.25, block_m=128, block_n=128, sink_tiles=1)
    assert wide.keep.shape == (1, 1, 6, 6) and torch.equal(wide.keep, expected.keep)


@pytest.mark.gpu
@pytest.mark.parametrize("pv", ["fp16", "fp8"])
def test_a_dynamic_selection_meets_the_contract_on_gpu(pv):
    """sageattn(tile_mask=DynamicSelection) on planted inputs (1 x 4 x 8,192 tokens, d128, 2x8x8 cells):
    against exact attention restricted to the lists the same selection makes, the dense floors."""
    from sagevideo.attention.sparse import select_tile_lists
    from sagevideo.eval.numerics.planted import PlantedSpec, planted_inputs
    from sagevideo.kernels.tile_select import DynamicSelection, grid_tile_order

    x = planted_inputs(PlantedSpec(1, 4, 8, 16, 64, 128), order=grid_tile_order(8, 16, 64, 2, 8, 8), device=DEVICE)
    q, k, v = (t.half() for t in (x.q, x.k, x.v))
    selection = DynamicSelection(top_p=0.9, local_tiles=1)
    out = sageattn(q, k, v, tile_mask=selection, pv=pv, backend="triton")
    lists = select_tile_lists(q, k, selection, pv=pv)
    assert 0 < lists.density < 1
    stats = error_stats(masked_attention_exact(q, k, v, lists.to_mask()), out)
    print(f"\ndynamic selection pv={pv}: density {lists.density:.3f}, {stats}")
    assert stats.nonfinite == 0 and stats.cos_worst >= {"fp16": 0.999, "fp8": 0.998}[pv], stats


@pytest.mark.gpu
@pytest.mark.parametrize("pv", ["fp16", "fp8"])
def test_an_installed_dynamic_call_replays_in_a_cuda_graph(pv):
    """What an installed model's dynamic call passes (`dynamic_selection`: a per-row density, the probe)
    selects and attends with no host read, so a CUDA graph captures it: the replay on new inputs copied
    into the captured ones gives the eager call's output on them, bit for bit."""
    from sagevideo.attention.sparse import dynamic_selection, key_tiles_of
    from sagevideo.eval.numerics.planted import PlantedSpec, planted_inputs
    from sagevideo.kernels.dispatch import kernel_for
    from sagevideo.kernels.tile_select import grid_tile_order

    def inputs(seed):
        spec = PlantedSpec(1, 4, 8, 16, 64, 128, seed=seed)
        x = planted_inputs(spec, order=grid_tile_order(8, 16, 64, 2, 8, 8), device=DEVICE)
        return [t.to(torch.bfloat16) for t in (x.q, x.k, x.v)]

    first, second = inputs(0), inputs(1)
    selection = dynamic_selection(0.3, key_tiles=key_tiles_of(first[1], pv))
    attend = lambda q, k, v: sageattn(q, k, v, tile_mask=selection, pv=pv, backend="triton")
    static = [t.clone() for t in first]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capture: Triton compiles, the allocator settles
        attend(*static)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = attend(*static)
    for fresh in (second, first):
        for into, value in zip(static, fresh, strict=True):
            into.copy_(value)
        graph.replay()
        assert torch.equal(captured, attend(*fresh))
    assert last_backend().ran == kernel_for(first[0].device, 128, pv).kernel and 0 < last_backend().density < 1


def test_installed_dynamic_calls_probe_one_column_in_64_key_tiles(monkeypatch):
    """`dynamic_selection` sizes the probe by the call's key tiles (Wan 720p's 591: 9 columns), and
    `scores_at` (what calibration reads) selects with the same settings: the probe's top columns forced."""
    from sagevideo.attention.sparse import dynamic_selection, key_tiles_of, probe_columns_for, scores_at
    from sagevideo.kernels import tile_select

    assert [probe_columns_for(t) for t in (1, 63, 64, 139, 591, 4096)] == [1, 1, 1, 2, 9, 64]
    assert dynamic_selection(0.15, key_tiles=591).probe_columns == 9
    gen = torch.Generator().manual_seed(0)
    centres = torch.randn(1, 2, 130, 64, generator=gen).repeat_interleave(64, dim=2)[:, :, :8300]
    q, k = (centres + 0.05 * torch.randn(1, 2, 8300, 64, generator=gen) for _ in range(2))  # self-similar tiles
    assert key_tiles_of(k, "fp16") == 130  # 64-key tiles at d64 with FP16 P·V

    def planted_mass(q, k, *, block_n, sm_scale, key_mask=None):
        mass = torch.zeros(q.shape[0], q.shape[1], 130)
        mass[..., 77], mass[..., 5] = 0.5, 0.3
        return mass

    monkeypatch.setattr(tile_select, "probe_mass", planted_mass)
    forced = scores_at(q, k, pv="fp16").forced
    assert forced[..., 77].all() and forced[..., 5].all() and forced.float().mean() < 0.1
