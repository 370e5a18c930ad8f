"""Ulysses sequence parallelism over 2 CPU processes (gloo) equals one process (CogVideoX and Open-Sora).

Tolerance: with full-precision SDPA inside, the sharded forward differs from one process only by
fp32 summation order (all-to-all moves data exactly): max |diff| < 1e-5. With sagevideo's
quantized attention (reference backend), each head's attention sees exactly the same inputs,
quantization groups included, so the same bound holds. (The CogVideoX processor under Ulysses:
tests/pipelines/cogvideox/test_sequence_parallel.py.)
"""

import os

import pytest
import torch

from sagevideo.parallel.ulysses import check_degree
from sagevideo.pipelines.cogvideox.sequence_parallel import check_cogvideox_degree


def _inputs(config, size=None):
    """CogVideoX inputs at the config's latent size, or size x size latents."""
    gen = torch.Generator().manual_seed(1)
    from diffusers.models.embeddings import get_3d_rotary_pos_embed

    h, w, p = size or config.sample_height, size or config.sample_width, config.patch_size
    rotary = get_3d_rotary_pos_embed(config.attention_head_dim, ((0, 0), (h // p, w // p)), (h // p, w // p), 3)
    return dict(
        hidden_states=torch.randn(2, 3, config.in_channels, h, w, generator=gen),
        encoder_hidden_states=torch.randn(2, 16, config.text_embed_dim, generator=gen),
        timestep=torch.tensor([10, 10]), image_rotary_emb=rotary, return_dict=False,
    )


def _model():
    from diffusers import CogVideoXTransformer3DModel

    from sagevideo.pipelines.cogvideox.tiny import TRANSFORMER_CONFIG

    torch.manual_seed(0)
    return CogVideoXTransformer3DModel(**TRANSFORMER_CONFIG).eval()


BACKENDS = ("sdpa", "reference")
# Block-sparse plans over the ranks (`job_plan`, backend sdpa: full precision on the mask's tiles), at
# 3 x 12 x 12 video tokens (24 x 24 latents): static windows skip tiles on any weights; dynamic
# selection keeps every tile of random weights, so it shows only that each rank selects and runs.
SPARSE = ("static:0.3", "dynamic:0.3")
SPARSE_SIZE = 24
OPENSORA_TINY = dict(hidden_size=64, num_heads=2, depth=1, depth_single_blocks=1, axes_dim=(8, 12, 12),
                     context_in_dim=32, vec_in_dim=16)


def _opensora(size=8):
    from sagevideo.pipelines.opensora import OpenSoraTransformer3DModel
    from sagevideo.pipelines.opensora.packing import latent_ids, text_ids

    torch.manual_seed(0)
    model = OpenSoraTransformer3DModel(**OPENSORA_TINY).eval()
    gen = torch.Generator().manual_seed(2)
    ids = latent_ids(1, 3, size, size)
    inputs = dict(
        img=torch.randn(1, ids.shape[1], 64, generator=gen), img_ids=ids,
        txt=torch.randn(1, 8, 32, generator=gen), txt_ids=text_ids(1, 8), timesteps=torch.tensor([0.5]),
        y_vec=torch.randn(1, 16, generator=gen), cond=torch.zeros(1, ids.shape[1], 68),
    )
    return model, inputs


def _worker(rank, world, port, out_dir):
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    from sagevideo.parallel.launch import init_from_env
    from sagevideo.pipelines.cogvideox.sequence_parallel import shard_cogvideox
    from sagevideo.pipelines.opensora.sequence_parallel import shard_opensora

    init_from_env("gloo")
    model = _model()
    opensora, opensora_inputs = _opensora()
    for backend in BACKENDS:
        with torch.no_grad(), shard_cogvideox(model, backend=backend):
            out = model(**_inputs(model.config))[0]
        torch.save(out, os.path.join(out_dir, f"{backend}-rank{rank}.pt"))
        with torch.no_grad(), shard_opensora(opensora, backend=backend):
            out = opensora(**opensora_inputs)
        torch.save(out, os.path.join(out_dir, f"opensora-{backend}-rank{rank}.pt"))
    torch.save(_sparse_runs(lambda m, plan: shard_cogvideox(m, plan=plan, backend="sdpa"),
                            lambda m, plan: shard_opensora(m, plan=plan, backend="sdpa")),
               os.path.join(out_dir, f"sparse-rank{rank}.pt"))
    torch.save(_balanced_run(lambda m, plan: shard_cogvideox(m, plan=plan, backend="sdpa")),
               os.path.join(out_dir, f"balanced-rank{rank}.pt"))
    torch.distributed.destroy_process_group()


def _sparse_runs(install_cogvideox, install_opensora):
    """{(family, setting): (output, per-layer densities)} of each SPARSE plan under the install given."""
    import sagevideo
    from sagevideo.pipelines.sparse import job_plan
    from tests.helpers.sparse import layer_densities

    model, (opensora, opensora_inputs) = _model(), _opensora(SPARSE_SIZE)
    runs = {}
    for setting in SPARSE:
        for family, m, install, inputs in (("cogvideox", model, install_cogvideox, _inputs(model.config, SPARSE_SIZE)),
                                           ("opensora", opensora, install_opensora, opensora_inputs)):
            with torch.no_grad(), install(m, job_plan(m, "fp16", setting, steps=5)), \
                    sagevideo.record_backends() as log:
                out = m(**inputs)
            out = out[0] if family == "cogvideox" else out
            runs[family, setting] = out, layer_densities(log.summary())
    return runs


BALANCED_HEADS = (0.9, 0.8, 0.1, 0.1)  # heads 0 and 1 on rank 0 would carry 1.7 of 1.9


def _balanced_run(install):
    """(output, head orders the exchanges took) of a 4-head CogVideoX under a calibrated top_p plan with
    per-head densities (`Sparse.head_density`), the orders recorded where the processor passes them."""
    from diffusers import CogVideoXTransformer3DModel

    from sagevideo.pipelines.cogvideox import sequence_parallel
    from sagevideo.pipelines.cogvideox.tiny import TRANSFORMER_CONFIG
    from sagevideo.pipelines.plans import AttentionPlan, Choice, Mode, Sparse

    torch.manual_seed(0)
    model = CogVideoXTransformer3DModel(**{**TRANSFORMER_CONFIG, "num_attention_heads": 4,
                                           "attention_head_dim": 32}).eval()
    sparse = Sparse(method="dynamic", density=0.3, top_p=0.9, head_density=BALANCED_HEADS)
    plan = AttentionPlan(default=Choice(mode=Mode.int8_fp16, sparse=sparse))
    orders, exchange = [], sequence_parallel.ulysses_exchange

    def recording(*args, heads=None, **kwargs):
        orders.append(None if heads is None else heads.tolist())
        return exchange(*args, heads=heads, **kwargs)

    sequence_parallel.ulysses_exchange = recording
    try:
        with torch.no_grad(), install(model, plan):
            out = model(**_inputs(model.config, SPARSE_SIZE))[0]
    finally:
        sequence_parallel.ulysses_exchange = exchange
    return out, orders


@pytest.mark.slow  # two processes (gloo)
def test_two_ranks_equal_one_process(tmp_path, two_ranks):
    import sagevideo

    model = _model()
    two_ranks(_worker, str(tmp_path))
    opensora, opensora_inputs = _opensora()
    for backend in BACKENDS:
        with torch.no_grad(), sagevideo.install(model, backend=backend):
            single = model(**_inputs(model.config))[0]
        with torch.no_grad(), sagevideo.install(opensora, backend=backend):
            single_opensora = opensora(**opensora_inputs)
        for rank in range(2):
            sharded = torch.load(tmp_path / f"{backend}-rank{rank}.pt")
            assert (sharded - single).abs().max() < 1e-5, (backend, rank)
            sharded = torch.load(tmp_path / f"opensora-{backend}-rank{rank}.pt")
            assert sharded.shape == single_opensora.shape
            assert (sharded - single_opensora).abs().max() < 1e-5, ("opensora", backend, rank)
    # each rank selects tiles over its own heads of the whole sequence, as one process does
    singles = _sparse_runs(lambda m, plan: sagevideo.install(m, plan, backend="sdpa"),
                           lambda m, plan: sagevideo.install(m, plan, backend="sdpa"))
    for (family, setting), (single, densities) in singles.items():
        if setting.startswith("static"):
            assert min(densities.values()) < 1.0, family  # tiles were skipped
        for rank in range(2):
            sharded, rank_densities = torch.load(tmp_path / f"sparse-rank{rank}.pt")[family, setting]
            assert (sharded - single).abs().max() < 1e-5, (family, setting, rank)
            assert rank_densities == pytest.approx(densities), (family, setting, rank)
    # per-head densities in the plan: the ranks take heads (0, 3) and (1, 2), the output is one process's
    single, _ = _balanced_run(lambda m, plan: sagevideo.install(m, plan, backend="sdpa"))
    for rank in range(2):
        sharded, orders = torch.load(tmp_path / f"balanced-rank{rank}.pt")
        assert orders == [[0, 3, 1, 2]] * 2  # both layers (the plan keeps none dense: no steps given)
        assert (sharded - single).abs().max() < 1e-5, rank


def _attention_worker(rank, world, port, out_dir):
    """ulysses_attention on this rank's shard of fixed q/k/v, for 1, 2 and 4 head chunks."""
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    from sagevideo.parallel.launch import init_from_env
    from sagevideo.parallel.ulysses import ulysses_attention

    init_from_env("gloo")
    q, k, v = _full_qkv()
    text, n = 5, (q.shape[2] - 5) // world
    shard = [torch.cat([t[:, :, :text], t[:, :, text + rank * n : text + (rank + 1) * n]], dim=2) for t in (q, k, v)]
    sent = []  # data_ptr of every all-to-all's input
    exchange = torch.distributed.all_to_all_single

    def recording_exchange(output, input, *args, **kwargs):
        sent.append(input.data_ptr())
        return exchange(output, input, *args, **kwargs)

    torch.distributed.all_to_all_single = recording_exchange
    for chunks in (1, 2, 4):
        for layout in ("contiguous", "kernels"):
            calls, outputs = [], []

            def attend(*qkv, calls=calls, outputs=outputs, layout=layout):
                calls.append(qkv[0].shape[1])
                out = torch.nn.functional.scaled_dot_product_attention(*qkv)
                # The kernels allocate their output as empty_like(q); "contiguous": (B, hc, S, D).
                out = torch.empty_like(qkv[0]).copy_(out) if layout == "kernels" else out.contiguous()
                outputs.append(out[:, :, text:].data_ptr())
                return out

            sent.clear()
            out = ulysses_attention(attend, *shard, text, chunks=chunks)
            without_copy = all(ptr in sent for ptr in outputs)
            torch.save((out, calls, without_copy), os.path.join(out_dir, f"chunks{chunks}-{layout}-rank{rank}.pt"))
        # text_last: [own video; text] per rank (HunyuanVideo's order), attention over [all video; text].
        video_first = [torch.cat([t[:, :, text + rank * n : text + (rank + 1) * n], t[:, :, :text]], dim=2)
                       for t in (q, k, v)]
        seen = []

        def attend_video_first(*qkv, seen=seen):
            seen.append(qkv[0].clone())
            return torch.nn.functional.scaled_dot_product_attention(*qkv)

        out = ulysses_attention(attend_video_first, *video_first, text, chunks=chunks, text_last=True)
        torch.save((out, seen), os.path.join(out_dir, f"chunks{chunks}-text-last-rank{rank}.pt"))
        # a head order (`parallel.balance`): rank r attends to heads HEAD_ORDER[4r : 4r + 4], either text order
        for text_last, inputs in ((False, shard), (True, video_first)):
            seen = []

            def attend_recording(*qkv, seen=seen):
                seen.append(qkv[0].clone())
                return torch.nn.functional.scaled_dot_product_attention(*qkv)

            out = ulysses_attention(attend_recording, *inputs, text, chunks=chunks, text_last=text_last,
                                    heads=torch.tensor(HEAD_ORDER))
            torch.save((out, seen), os.path.join(out_dir, f"chunks{chunks}-order-{text_last}-rank{rank}.pt"))
    torch.distributed.all_to_all_single = exchange  # this rank's process runs other tests' functions next
    torch.distributed.destroy_process_group()


HEAD_ORDER = (5, 0, 3, 6, 1, 2, 4, 7)


def _full_qkv():
    gen = torch.Generator().manual_seed(5)
    return [torch.randn(2, 8, 5 + 2 * 12, 16, generator=gen) for _ in range(3)]  # 5 text + 24 video tokens


@pytest.mark.slow  # two processes (gloo)
def test_ulysses_attention_in_head_chunks_equals_full_attention(tmp_path, two_ranks):
    """The pipelined exchange (heads in chunks, async all-to-alls) is pure data movement: each
    rank gets exactly full attention on its tokens, for any chunk count; attend runs once per chunk
    on strided views of the receive buffer. An output laid out like the kernels' (empty_like(q):
    token-major) is sent back as it is; a (B, hc, S, D)-contiguous one is copied once. With the
    text after the video (`text_last`, HunyuanVideo's order) attend sees [all video; text]."""
    two_ranks(_attention_worker, str(tmp_path))
    q, k, v = _full_qkv()
    full = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    for chunks, heads_per_call in ((1, [4]), (2, [2, 2]), (4, [1, 1, 1, 1])):
        for layout in ("contiguous", "kernels"):
            for rank in range(2):
                out, calls, without_copy = torch.load(tmp_path / f"chunks{chunks}-{layout}-rank{rank}.pt")
                want = torch.cat([full[:, :, :5], full[:, :, 5 + rank * 12 : 5 + (rank + 1) * 12]], dim=2)
                assert calls == heads_per_call
                assert torch.equal(out, want), (chunks, layout, rank)
                assert without_copy == (layout == "kernels"), (chunks, layout, rank)
    # text after the video (text_last): attend sees [all video; text] in that order, each rank gets
    # [its video; text] of full attention over that sequence.
    video_first = [torch.cat([t[:, :, 5:], t[:, :, :5]], dim=2) for t in (q, k, v)]
    full = torch.nn.functional.scaled_dot_product_attention(*video_first)
    for chunks, heads_per_call in ((1, 4), (2, 2), (4, 1)):
        for rank in range(2):
            out, seen = torch.load(tmp_path / f"chunks{chunks}-text-last-rank{rank}.pt")
            first_heads = video_first[0][:, rank * 4 : rank * 4 + heads_per_call]  # rank r holds heads 4r..4r+3
            assert torch.equal(seen[0], first_heads)
            want = torch.cat([full[:, :, rank * 12 : (rank + 1) * 12], full[:, :, 24:]], dim=2)
            assert torch.equal(out, want), (chunks, rank)


@pytest.mark.slow  # two processes (gloo)
def test_ulysses_attention_in_a_head_order_gives_each_rank_those_heads_and_the_same_output(tmp_path, two_ranks):
    """With a head order (`heads`), rank r attends to heads order[r·H/P : (r+1)·H/P] (the text's head
    slices follow it), and the output is full attention in the heads' own order, bit for bit, for either
    text order and any chunk count."""
    from tests.parallel.test_ulysses import HEAD_ORDER, _attention_worker

    two_ranks(_attention_worker, str(tmp_path))
    q, k, v = _full_qkv()
    full = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    video_first = [torch.cat([t[:, :, 5:], t[:, :, :5]], dim=2) for t in (q, k, v)]
    full_video_first = torch.nn.functional.scaled_dot_product_attention(*video_first)
    for chunks, per_call in ((1, 4), (2, 2), (4, 1)):
        for rank in range(2):
            mine = list(HEAD_ORDER[rank * 4 : (rank + 1) * 4])
            out, seen = torch.load(tmp_path / f"chunks{chunks}-order-False-rank{rank}.pt")
            assert torch.equal(out, torch.cat([full[:, :, :5], full[:, :, 5 + rank * 12 : 5 + (rank + 1) * 12]], 2))
            assert torch.equal(torch.cat(seen, dim=1), q[:, mine]), (chunks, rank)  # [text; all video] of its heads
            assert all(s.shape[1] == per_call for s in seen)
            out, seen = torch.load(tmp_path / f"chunks{chunks}-order-True-rank{rank}.pt")
            want = torch.cat([full_video_first[:, :, rank * 12 : (rank + 1) * 12], full_video_first[:, :, 24:]], 2)
            assert torch.equal(out, want), (chunks, rank)
            assert torch.equal(torch.cat(seen, dim=1), video_first[0][:, mine]), (chunks, rank)


def test_degree_errors_are_clear():
    with pytest.raises(ValueError, match=r"30 attention heads are not divisible by 4 \(usable degrees: \[1, 2, 3, 5"):
        check_degree(30, 17550, 4)
    from types import SimpleNamespace

    cfg = SimpleNamespace(num_attention_heads=48, patch_size=2, patch_size_t=None, max_text_seq_length=226)
    with pytest.raises(ValueError, match=r"17776 tokens \(226 text \+ 17550 video\) are not divisible by 3"):
        check_cogvideox_degree(cfg, 13, 60, 90, 3)
    # 17550 video tokens alone do not split in 4, the joint sequence does (4 x 4444).
    for degree in (2, 4, 8):
        check_cogvideox_degree(cfg, 13, 60, 90, degree)
