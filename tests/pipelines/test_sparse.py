"""Block-sparse plan choices inside a router (`pipelines/sparse.py`, issue 36 stage 4a): every call
under a sparse plan is noted with its density, a call that cannot be sparse runs dense with the
reason (never in silence), Ulysses refuses sparse plans, `job_plan`'s defaults. The runs of each
family: the family test folders (`tests/helpers/sparse.py`)."""

import math

import pytest
import torch

from sagevideo.attention.records import record_backends
from sagevideo.pipelines.families import TEXT_FIRST, TEXT_LAST
from sagevideo.pipelines.install import plan_router
from sagevideo.pipelines.plans import AttentionPlan, Choice, Mode, Sparse
from sagevideo.pipelines.routing import AttentionRouter
from sagevideo.pipelines.sparse import NO_GRID, NOT_PLAIN, NOT_SPARSE_LAYER, grid_mismatch, job_plan

STATIC = Sparse(method="static", density=0.3)
GRID = (2, 8, 16)  # 256 video tokens


def _router(text: dict, grid=GRID) -> AttentionRouter:
    plan = AttentionPlan(default=Choice(mode=Mode.int8_fp16, sparse=STATIC),
                         overrides=({"layers": ["dense"], "mode": "int8-fp16"},))
    router = AttentionRouter(plan, backend="sdpa")
    router.sparse.text.update(text)
    router.sparse.grid = grid
    return router


def _qkv(n: int, heads: int = 2):
    gen = torch.Generator().manual_seed(n)
    return (torch.randn(1, heads, n, 64, generator=gen) for _ in range(3))


def test_sparse_calls_run_their_mask_and_every_call_is_noted_with_its_density():
    text = 40
    router = _router({"joint": TEXT_LAST, "dense": TEXT_LAST})
    q, k, v = _qkv(text + math.prod(GRID))
    with record_backends() as log:
        sparse_out = router("joint", q, k, v)
        dense_out = router("dense", q, k, v)  # the plan's dense choice for this layer
    joint, dense = log.sparse
    assert (joint.layer, joint.step, joint.reason) == ("joint", None, "") and 0 < joint.density < 1
    assert (dense.layer, dense.density, dense.reason) == ("dense", 1.0, "")
    assert log.choices[0].density == pytest.approx(joint.density) and log.choices[1].density is None
    assert not torch.allclose(sparse_out, dense_out, atol=1e-3)
    summary = log.summary()["sparse"]
    assert summary == {"layers": {"joint": {"calls": 1, "density": round(joint.density, 4),
                                            "min": round(joint.density, 4), "sparse_calls": 1,
                                            "sparse_density": round(joint.density, 4)},
                                  "dense": {"calls": 1, "density": 1.0, "min": 1.0}},
                       "steps": {"none": round((joint.density + 1) / 2, 4)}, "dense": {}}


def test_a_forwards_calls_noted_at_its_end_read_as_each_call_noted_at_once():
    """Routes add each sparse call to their statistics on the device; `collect_sparse` (the end of a
    forward) notes a layer's calls so that its summary (calls, mean, least, per step) is the one of each
    call noted at once (a call by name), here two calls of one layer at two densities and a dense one."""
    router = _router({"joint": TEXT_LAST, "dense": TEXT_LAST})
    calls = [(grid, tuple(_qkv(40 + math.prod(grid)))) for grid in (GRID, (2, 8, 8), GRID)]

    def run(by_name: bool):
        with record_backends() as log:
            for layer in ("joint", "dense"):
                for grid, qkv in calls:
                    router.sparse.grid = grid
                    if by_name:
                        router(layer, *qkv)
                    else:
                        router.attend(router.route(layer), *qkv)
            router.collect_sparse()
        return log

    at_once, at_end = run(by_name=True), run(by_name=False)
    densities = sorted({note.density for note in at_once.sparse if note.layer == "joint"})
    assert len(densities) == 2 and densities[0] < 1
    assert at_end.summary()["sparse"] == at_once.summary()["sparse"]
    assert at_end.summary()["sparse"]["layers"]["joint"]["calls"] == 3


def test_statistics_are_not_read_while_a_cuda_graph_is_captured_and_are_noted_at_the_next_read(monkeypatch):
    """The end-of-forward reads (sparse notes, the guard's counts) would end a CUDA-graph capture: while one
    is captured they read nothing, and the next read outside it notes every call since (each replay's
    too). (`records.capturing` is what torch says on a GPU; set here.)"""
    import sagevideo.attention.records as records
    import sagevideo.pipelines.sparse_notes as sparse_notes
    from sagevideo.pipelines.guard import AttentionGuard

    router = _router({"joint": TEXT_LAST})
    guard = AttentionGuard(router, "warn")
    qkv = tuple(_qkv(40 + math.prod(GRID)))
    for module in (records, sparse_notes):
        monkeypatch.setattr(module, "capturing", lambda: True)
    with record_backends() as log:
        for _ in range(2):
            router.attend(router.route("joint"), *qkv)
            router.collect_sparse()
            assert guard.collect() == {} and guard.read == {}  # nothing read
        assert log.sparse == []
        for module in (records, sparse_notes):
            monkeypatch.setattr(module, "capturing", lambda: False)
        router.collect_sparse()
        guard.collect()
    assert guard.read == {"joint": 0}
    assert [note.layer for note in log.sparse] == ["joint", "joint"] and all(n.density < 1 for n in log.sparse)


@pytest.mark.parametrize("case", ["not-a-sparse-layer", "no-grid", "mismatch", "text-in-a-video-layer", "dropout",
                                  "grouped-heads"])
def test_a_call_that_cannot_be_sparse_runs_dense_with_the_reason(case):
    n = math.prod(GRID) + (0 if case == "text-in-a-video-layer" else 40)
    text = {"video": None} if case == "text-in-a-video-layer" else {"joint": TEXT_FIRST}
    router = _router({} if case == "not-a-sparse-layer" else text, grid=None if case == "no-grid" else GRID)
    q, k, v = _qkv({"mismatch": math.prod(GRID) - 8, "text-in-a-video-layer": n + 8}.get(case, n))
    kwargs = {"dropout_p": 0.5} if case == "dropout" else {}
    if case == "grouped-heads":
        k, v, kwargs = k[:, :1], v[:, :1], {"enable_gqa": True}
    layer = "video" if case == "text-in-a-video-layer" else "joint"
    with record_backends() as log:
        out = router(layer, q, k, v, **kwargs)
    want = {"not-a-sparse-layer": NOT_SPARSE_LAYER, "no-grid": NO_GRID, "dropout": NOT_PLAIN,
            "grouped-heads": NOT_PLAIN, "mismatch": grid_mismatch(q.shape[2], GRID, TEXT_FIRST),
            "text-in-a-video-layer": grid_mismatch(q.shape[2], GRID, None)}[case]
    assert [(n.density, n.reason) for n in log.sparse] == [(1.0, want)]
    assert log.summary()["sparse"]["dense"] == {want: 1}
    assert log.summary()["sparse"]["layers"][layer]["dense"] == {want: 1}  # and per layer
    if case != "dropout":  # dense attention, as the plan's mode computes it without the mask
        assert torch.equal(out, torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=k.shape[1] == 1))


PLANTED_GRID = (4, 16, 32)


def _planted(text: int = 0, seed: int = 0, grid: tuple[int, int, int] = PLANTED_GRID):
    """Planted q, k, v (1, 2, text + 2048, 64) on PLANTED_GRID with `text` tokens first, windows wide
    enough that raster tiles are self-similar (the selection judges them rather than keeping them)."""
    from sagevideo.eval.numerics.planted import PlantedSpec, planted_inputs

    spec = PlantedSpec(batch=1, heads=2, frames=grid[0], height=grid[1], width=grid[2], head_dim=64,
                       text_prefix=text, stripe_every=2, lengthscale=(3.0, 32.0, 32.0), seed=seed)
    made = planted_inputs(spec)
    return made.q, made.k, made.v


def test_a_calibrated_top_p_runs_one_top_p_per_call_in_place_of_the_per_row_density(monkeypatch):
    """A plan's dynamic choice with a top_p: the installed call passes `DynamicSelection(top_p=...)` (no
    per-row density; text, sink and diagonal forced as before), computes the PyTorch selection at that
    top_p, and is noted with the density it reached. Without a top_p: the per-row density, as before."""
    import sagevideo.pipelines.routing as routing
    from sagevideo.attention.sparse import scores_at
    from sagevideo.kernels.tile_select import DynamicSelection

    passed = []
    attend = routing.scaled_dot_product_attention

    def spy(*args, **kwargs):
        passed.append(kwargs.get("tile_mask"))
        return attend(*args, **kwargs)

    monkeypatch.setattr(routing, "scaled_dot_product_attention", spy)
    text = 40
    q, k, v = _planted(text)
    calibrated = Sparse(method="dynamic", density=0.3, top_p=0.8)
    outs, densities = [], []
    for sparse in (calibrated, Sparse(method="dynamic", density=0.3)):
        router = AttentionRouter(AttentionPlan(default=Choice(mode=Mode.int8_fp16, sparse=sparse)), backend="sdpa")
        router.sparse.text.update({"joint": TEXT_FIRST})
        router.sparse.grid = PLANTED_GRID
        with record_backends() as log:
            outs.append(router("joint", q, k, v))
        densities.append(log.sparse[0].density)
    by_top_p, per_row = passed
    probe = {"probe_columns": 1}  # one of each 64 key tiles (these inputs have fewer), at least one
    assert by_top_p == DynamicSelection(top_p=0.8, sink_tiles=1, dense_prefix=text, **probe)
    assert by_top_p.density is None
    assert per_row == DynamicSelection(density=0.3, sink_tiles=1, dense_prefix=text, **probe)
    mask = scores_at(q, k, pv="fp16", text_first=text).keep(0.8)
    assert 0.5 < mask.density < 0.8 and densities[0] == pytest.approx(mask.density) and densities[1] < 0.5
    want = sagevideo_sdpa(q, k, v, mask)
    assert torch.equal(outs[0], want) and not torch.equal(outs[0], outs[1])


def sagevideo_sdpa(q, k, v, mask):
    """The sdpa backend's call on `mask`'s tiles (what the router's int8-fp16 choice computes there)."""
    from sagevideo.attention.functional import scaled_dot_product_attention

    return scaled_dot_product_attention(q, k, v, pv="fp16", backend="sdpa", tile_mask=mask)


def _reusing_router(reuse_steps: int) -> AttentionRouter:
    sparse = Sparse(method="dynamic", density=0.3, reuse_steps=reuse_steps)
    router = AttentionRouter(AttentionPlan(default=Choice(mode=Mode.int8_fp16, sparse=sparse)), backend="sdpa")
    router.sparse.text.update({"joint": TEXT_FIRST})
    router.sparse.grid = PLANTED_GRID
    return router


@pytest.mark.parametrize("reuse_steps", [2, 3])
def test_a_plan_that_reuses_lists_attends_on_those_its_forward_selected_at_the_runs_selecting_step(reuse_steps):
    """reuse_steps=R: at steps 0, R, ... each of a step's two forwards (guidance) selects on its own
    inputs; at the steps between, each attends on the lists its own forward selected last (not on
    fresh ones), noted as reused. A step that does not follow the last (the clock back at 0: a new
    video) selects again, as does a call whose shape the kept lists do not fit."""
    from sagevideo.attention.sparse import dynamic_selection, key_tiles_of, select_tile_lists

    text = 40
    router = _reusing_router(reuse_steps)
    route = router.route("joint")

    def lists(q, k):
        selection = dynamic_selection(0.3, key_tiles=key_tiles_of(k, "fp16"), text_first=text)
        return select_tile_lists(q, k, selection, pv="fp16")

    selected_at = {}
    for step in (0, 1, 2, 3, 0):
        router.clock.step = step
        for forward in range(2):
            q, k, v = _planted(text, seed=10 * step + forward)
            router.sparse.forward_started()
            with record_backends() as log:
                out = router.attend(route, q, k, v)
                router.collect_sparse()
            reused = step % reuse_steps != 0
            if not reused:
                selected_at[forward] = lists(q, k)
            want = sagevideo_sdpa(q, k, v, selected_at[forward])
            assert torch.equal(out, want), (step, forward)
            assert [note.reused for note in log.sparse] == [reused]
            if reused:  # the fresh lists differ: attending on the kept ones is seen
                fresh = lists(q, k)
                assert not torch.equal(fresh.indices, selected_at[forward].indices)
                assert not torch.equal(out, sagevideo_sdpa(q, k, v, fresh))
                assert log.summary()["sparse"]["layers"]["joint"]["reused"] == 1
    router.clock.step = 1  # follows 0: a reusing step, but a call of another shape selects afresh
    router.sparse.forward_started()
    router.sparse.grid = (2, 16, 32)
    q, k, v = _planted(text, seed=99, grid=router.sparse.grid)
    with record_backends() as log:
        out = router.attend(route, q, k, v)
        router.collect_sparse()
    assert [note.reused for note in log.sparse] == [False] and torch.equal(out, sagevideo_sdpa(q, k, v, lists(q, k)))


def test_a_dense_plan_notes_nothing_and_installs_no_sparse_routing():
    router = AttentionRouter(AttentionPlan.uniform("int8-fp16"), backend="sdpa")
    assert router.sparse is None
    with record_backends() as log:
        router("a", *_qkv(64))
    assert log.sparse == [] and "sparse" not in log.summary()


def test_a_sparse_plan_gets_sparse_routing_and_off_builds_no_plan():
    plan = AttentionPlan(default=Choice(mode=Mode.int8_fp8, sparse=STATIC))
    assert plan_router(None, plan, "fp8", "auto").sparse is not None
    with pytest.raises(ValueError, match="--sparse off builds no plan"):
        job_plan(None, "fp16", "off", 5)


def test_the_grid_hook_and_layouts_come_with_install_and_go_with_remove(tiny_pipe):
    import sagevideo

    plan = job_plan(tiny_pipe, "fp8", "dynamic:0.2", steps=10)
    assert plan.overrides[0].steps == (0, 2) and plan.overrides[1].layers == ("transformer_blocks.0.attn1",)
    transformer = tiny_pipe.transformer
    hooks = len(transformer._forward_pre_hooks)
    with sagevideo.install(tiny_pipe, plan, backend="sdpa") as handle:
        assert handle.router.sparse.text == {"transformer_blocks.0.attn1": TEXT_FIRST,
                                             "transformer_blocks.1.attn1": TEXT_FIRST}
        assert len(transformer._forward_pre_hooks) == hooks + 3  # clock sync, grid, guard's
    assert len(transformer._forward_pre_hooks) == hooks
    with sagevideo.install(tiny_pipe, backend="sdpa") as handle:  # a dense plan: no grid hook
        assert handle.router.sparse is None and len(transformer._forward_pre_hooks) == hooks + 2


def _tiny_inputs() -> dict:
    gen = torch.Generator().manual_seed(0)
    return dict(hidden_states=torch.randn(2, 3, 4, 24, 24, generator=gen),  # 3x12x12 video tokens
                encoder_hidden_states=torch.randn(2, 32, 32, generator=gen), timestep=torch.tensor([500, 500]))


def _eager_and_compiled(tiny_pipe, plan: AttentionPlan, forwards: int = 2):
    """The tiny CogVideoX under `plan` (backend "reference"): one eager forward, then `forwards` with each
    block `.compile(backend="eager", fullgraph=True)`, each forward in its own `record_backends()` block.
    Returns (eager output, compiled outputs, eager log, compiled logs, unique graphs)."""
    from torch._dynamo.utils import counters

    import sagevideo

    transformer, inputs = tiny_pipe.transformer, _tiny_inputs()

    def forward():
        with torch.no_grad(), record_backends() as log:
            return transformer(**inputs, return_dict=False)[0], log

    torch._dynamo.reset()
    counters.clear()
    with sagevideo.install(transformer, plan, backend="reference"):
        eager, eager_log = forward()
        try:
            for block in transformer.transformer_blocks:
                block.compile(backend="eager", fullgraph=True)
            compiled = [forward() for _ in range(forwards)]
        finally:
            for block in transformer.transformer_blocks:
                block._compiled_call_impl = None  # back to eager for the session's other tests
    return eager, [out for out, _ in compiled], eager_log, [log for _, log in compiled], \
        counters["stats"]["unique_graphs"]


@pytest.mark.slow  # torch.compile
@pytest.mark.parametrize("sparse", [STATIC, Sparse(method="dynamic", density=0.3),
                                    Sparse(method="dynamic", density=0.3, top_p=0.8)],
                         ids=["static", "dynamic", "dynamic-top-p"])
def test_a_model_its_user_compiles_runs_a_sparse_plan_in_whole_graphs(tiny_pipe, sparse):
    """Regional compile (each block `.compile(fullgraph=True)`) of a model under a sparse plan: no graph
    break (selection reads nothing on the host: the static mask is a constant, the dynamic call selects a
    per-row density or a calibrated top_p inside itself; each call adds its density to its layer's
    statistics on the device), one graph shared by the blocks, outputs bit for bit eager's, and each
    compiled forward noted as the eager one (layers, densities)."""
    from torch._dynamo.utils import counters

    *_, dense_graphs = _eager_and_compiled(tiny_pipe, AttentionPlan.uniform("int8-fp16"), forwards=1)
    plan = AttentionPlan(default=Choice(mode=Mode.int8_fp16, sparse=sparse))
    eager, compiled, eager_log, compiled_logs, graphs = _eager_and_compiled(tiny_pipe, plan)
    assert torch.equal(compiled[0], eager) and torch.equal(compiled[1], eager)
    assert dict(counters["graph_break"]) == {}
    assert graphs == dense_graphs  # the model's own (its first block's input strides): none per layer or call
    summary = eager_log.summary()["sparse"]
    layers = summary["layers"]
    assert set(layers) == {"transformer_blocks.0.attn1", "transformer_blocks.1.attn1"}
    density = layers["transformer_blocks.1.attn1"]["density"]
    # random weights: tiles are not self-similar, so the dynamic selection keeps every tile
    assert (0 < density < 1) if sparse.method == "static" else density == 1.0
    assert all(entry["sparse_calls"] == 1 for entry in layers.values())
    for log in compiled_logs:
        assert log.summary()["sparse"] == summary
        assert len(log.choices) == len(eager_log.choices)


@pytest.mark.slow  # torch.compile
def test_a_compiled_model_reuses_lists_over_steps_in_whole_graphs(tiny_pipe):
    """Regional compile of a plan that reuses lists every other step: whether a step selects or reuses is
    set when the clock moves, outside the graphs, and the kept lists are graph inputs: no graph break,
    one more graph per block class at most (selecting, reusing), outputs bit for bit eager's at each
    step, the same calls noted reused."""
    from torch._dynamo.utils import counters

    import sagevideo
    from sagevideo.pipelines.routing import plan_router_of

    *_, dense_graphs = _eager_and_compiled(tiny_pipe, AttentionPlan.uniform("int8-fp16"), forwards=1)
    plan = AttentionPlan(default=Choice(mode=Mode.int8_fp16, sparse=Sparse(method="dynamic", density=0.3,
                                                                           reuse_steps=2)))
    transformer, inputs = tiny_pipe.transformer, _tiny_inputs()

    def steps(router):
        outs, reused = [], []
        for step in range(3):
            router.clock.step = step
            with torch.no_grad(), record_backends() as log:
                outs.append(transformer(**inputs, return_dict=False)[0])
            reused.append(sum(note.reused for note in log.sparse))
        return outs, reused

    torch._dynamo.reset()
    counters.clear()
    with sagevideo.install(transformer, plan, backend="reference") as handle:
        router = plan_router_of(handle.router)
        eager, eager_reused = steps(router)
        router.clock.step = None  # a new run: the compiled steps select afresh at step 0
        try:
            for block in transformer.transformer_blocks:
                block.compile(backend="eager", fullgraph=True)
            compiled, compiled_reused = steps(router)
        finally:
            for block in transformer.transformer_blocks:
                block._compiled_call_impl = None
    assert eager_reused == compiled_reused == [0, 2, 0]  # two sparse layers reuse at step 1
    assert all(torch.equal(a, b) for a, b in zip(eager, compiled, strict=True))
    assert dict(counters["graph_break"]) == {}
    assert counters["stats"]["unique_graphs"] <= 2 * dense_graphs


@pytest.mark.slow  # torch.compile
@pytest.mark.parametrize("case", ["static", "dynamic", "no-grid"])
def test_compiled_calls_kept_dense_are_noted_as_eager_ones_with_their_reasons(tiny_pipe, monkeypatch, case):
    """A plan that keeps a layer dense, and (no-grid) calls that cannot be sparse: compiled forwards note
    the same layers, densities and dense reasons as the eager one (the reason decided while tracing, noted
    by an effectful op with the route's key, never its name), with no graph break."""
    from torch._dynamo.utils import counters

    from sagevideo.pipelines.sparse import GridHook

    if case == "no-grid":  # the forward's grid unknown: every call its plan makes sparse runs dense
        monkeypatch.setattr(GridHook, "__call__", lambda self, module, args, kwargs: None)
    sparse = Sparse(method="dynamic", density=0.3) if case == "dynamic" else STATIC
    plan = AttentionPlan(default=Choice(mode=Mode.int8_fp16, sparse=sparse),
                         overrides=({"layers": ["transformer_blocks.0.attn1"], "mode": "int8-fp16"},))
    eager, compiled, eager_log, compiled_logs, _ = _eager_and_compiled(tiny_pipe, plan)
    assert torch.equal(compiled[0], eager) and dict(counters["graph_break"]) == {}
    summary = eager_log.summary()["sparse"]
    kept, planned = summary["layers"]["transformer_blocks.0.attn1"], summary["layers"]["transformer_blocks.1.attn1"]
    assert kept == {"calls": 1, "density": 1.0, "min": 1.0}
    assert planned["sparse_calls"] == 1
    if case == "no-grid":
        assert planned["dense"] == {NO_GRID: 1} and summary["dense"] == {NO_GRID: 1} and planned["density"] == 1.0
    else:
        assert "dense" not in planned and summary["dense"] == {}
    for log in compiled_logs:
        assert log.summary()["sparse"] == summary


@pytest.mark.gpu
def test_an_installed_sparse_forward_replays_in_a_cuda_graph(tiny_pipe):
    """A whole forward of a model under a dynamic sparse plan (the kernels' one-go selection, the guard,
    the sparse notes) captured in a CUDA graph: nothing reads the host while it is captured (the
    end-of-forward reads wait for a forward outside the capture), and the replay on new inputs equals
    an eager forward on them, bit for bit."""
    import copy

    import sagevideo

    transformer = copy.deepcopy(tiny_pipe.transformer).to("cuda", torch.bfloat16)
    plan = AttentionPlan(default=Choice(mode=Mode.int8_fp16, sparse=Sparse(method="dynamic", density=0.3)))

    def inputs(seed):
        gen = torch.Generator().manual_seed(seed)
        made = dict(hidden_states=torch.randn(2, 3, 4, 24, 24, generator=gen),
                    encoder_hidden_states=torch.randn(2, 32, 32, generator=gen))
        return {**{k: t.to("cuda", torch.bfloat16) for k, t in made.items()},
                "timestep": torch.tensor([500, 500], device="cuda")}

    static = inputs(0)
    with sagevideo.install(transformer, plan, backend="triton"), torch.no_grad():
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up off the capture: Triton compiles, the allocator settles
            transformer(**static, return_dict=False)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = transformer(**static, return_dict=False)[0]
        for seed in (1, 0):
            fresh = inputs(seed)
            for name, tensor in fresh.items():
                static[name].copy_(tensor)
            graph.replay()
            with record_backends() as log:
                eager = transformer(**fresh, return_dict=False)[0]
            assert torch.equal(captured, eager), seed
            assert log.summary()["sparse"]["layers"] and {c.ran for c in log.choices} == {"triton"}


def test_an_installed_dynamic_call_reads_nothing_on_the_host(tiny_pipe, monkeypatch):
    """Eagerly too, an installed model's dynamic call reads nothing back (item, bool, int, float, tolist
    raise inside each attention call): its density goes to its layer's statistics on the device, read
    once at the end of the forward."""
    import sagevideo
    from sagevideo.pipelines.routing import AttentionRouter

    attend = AttentionRouter._attend_with

    def refusing(self, *args, **kwargs):
        with pytest.MonkeyPatch.context() as patch:
            for name in ("item", "__bool__", "__int__", "__float__", "__index__", "tolist"):
                patch.setattr(torch.Tensor, name, _refuse)
            return attend(self, *args, **kwargs)

    monkeypatch.setattr(AttentionRouter, "_attend_with", refusing)
    plan = AttentionPlan(default=Choice(mode=Mode.int8_fp16, sparse=Sparse(method="dynamic", density=0.3)))
    # "sdpa": the selection and bookkeeping of the quantized backends, without the reference kernel (a CPU
    # emulation that skips key tiles by reading them)
    with sagevideo.install(tiny_pipe.transformer, plan, backend="sdpa"), torch.no_grad(), \
            record_backends() as log:
        tiny_pipe.transformer(**_tiny_inputs(), return_dict=False)
    assert [(n.layer, n.density, n.planned) for n in log.sparse] == [
        ("transformer_blocks.0.attn1", 1.0, True), ("transformer_blocks.1.attn1", 1.0, True)]
    assert all(math.isnan(c.density) is False for c in log.choices)  # read when asked, after the call


def _refuse(self, *args, **kwargs):
    raise AssertionError("a host read inside an attention call")


def test_calls_by_name_inside_an_installed_forward_are_noted_once_at_its_end(monkeypatch):
    """Sequence-parallel routers call every layer by name: inside an installed forward those calls are
    noted by the end-of-forward collection, one host read per forward (with Ulysses also one reduction
    over the ranks), not one per call; the notes are those of the installed path."""
    from diffusers import WanTransformer3DModel

    import sagevideo
    import sagevideo.pipelines.routing as routing
    from sagevideo.pipelines.install import install_router
    from sagevideo.pipelines.routing import AttentionRouter
    from sagevideo.pipelines.sparse import job_plan
    from sagevideo.pipelines.wan.tiny import TRANSFORMER_CONFIG

    class ByName(AttentionRouter):
        def __call__(self, layer, q, k, v, **kwargs):
            return super().__call__(layer, q, k, v, **kwargs)

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = WanTransformer3DModel(**TRANSFORMER_CONFIG).eval()
    gen = torch.Generator().manual_seed(1)
    inputs = dict(hidden_states=torch.randn(1, TRANSFORMER_CONFIG["in_channels"], 3, 24, 24, generator=gen),
                  timestep=torch.tensor([700.0]), encoder_hidden_states=torch.randn(1, 512, 32, generator=gen),
                  return_dict=False)
    plan = job_plan(model, "fp16", "static:0.3", steps=5)
    collected: list[int] = []
    real = routing.collect
    monkeypatch.setattr(routing, "collect", lambda routes, step: (collected.append(len(routes)), real(routes, step)))
    runs = []
    for router_class in (AttentionRouter, ByName):
        collected.clear()
        with torch.no_grad(), install_router(model, router_class(plan, "sdpa"), backend="sdpa"), \
                sagevideo.record_backends() as log:
            model(**inputs)
        runs.append((log.summary()["sparse"], list(collected)))
    (installed, installed_collections), (by_name, by_name_collections) = runs
    assert by_name == installed and min(layer["density"] for layer in installed["layers"].values()) < 1
    assert by_name_collections == installed_collections and len(installed_collections) == 1
