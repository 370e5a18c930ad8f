"""CogVideoX under Ulysses sequence parallelism: the sharded attention processor over 2 CPU
processes (gloo) equals one process exactly; the text/video shard ranges."""

import os

import pytest
import torch

# (text, video) tokens split over 2 ranks: [16 text + 16 video | 32 video], [32 text | 8 text + 24 video].
PROCESSOR_SPLITS = ((16, 48), (40, 24))


def _processor_qkv(text, video):
    """Normed bf16 q/k/v (B, H, T + N, D) of a joint [text; video] sequence and its rotary tables."""
    gen = torch.Generator().manual_seed(text)
    q, k, v = (torch.randn(2, 8, text + video, 64, generator=gen).to(torch.bfloat16) for _ in range(3))
    angles = torch.rand(video, 64, generator=gen) * 6.3
    return q, k, v, (angles.cos(), angles.sin())


def _processor_cases():
    for text, video in PROCESSOR_SPLITS:
        for rotary in (True, False):
            for cross in (False, True):
                yield text, video, rotary, cross


def _processor_worker(rank, world, port, out_dir):
    """UlyssesCogVideoXAttnProcessor.attend_projected on this rank's shard, 1 and 2 head chunks."""
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    from types import SimpleNamespace

    from sagevideo.parallel import ulysses
    from sagevideo.parallel.launch import init_from_env
    from sagevideo.pipelines.cogvideox.sequence_parallel import UlyssesCogVideoXAttnProcessor, shard_ranges

    init_from_env("gloo")
    processor = UlyssesCogVideoXAttnProcessor(backend="sdpa")
    outs, chunks_before = {}, ulysses.HEAD_CHUNKS
    for chunks in (1, 2):
        ulysses.HEAD_CHUNKS = chunks
        for text, video, rotary, cross in _processor_cases():
            q, k, v, freqs = _processor_qkv(text, video)
            (t0, t1), (v0, v1) = shard_ranges(text, video, world, rank)
            per = (text + video) // world
            q, k, v = (t[:, :, rank * per : (rank + 1) * per] for t in (q, k, v))
            attn = SimpleNamespace(is_cross_attention=cross)
            shard_rotary = tuple(f[v0:v1] for f in freqs) if rotary else None
            outs[chunks, text, video, rotary, cross] = processor.attend_projected(
                attn, q, k, v, None, t1 - t0, shard_rotary)
    ulysses.HEAD_CHUNKS = chunks_before  # this rank's process runs other tests' functions next
    torch.save(outs, os.path.join(out_dir, f"processor-rank{rank}.pt"))
    torch.distributed.destroy_process_group()


@pytest.mark.slow  # two processes (gloo)
def test_ulysses_cogvideox_processor_equals_one_process_exactly(tmp_path, two_ranks):
    """Rotary embedding written into the send buffer, shards holding text only, text and video, or
    video only: each rank's output is bit-equal to the one-process processor's for its tokens."""
    from types import SimpleNamespace

    from sagevideo.pipelines.cogvideox.processor import SageCogVideoXAttnProcessor

    two_ranks(_processor_worker, str(tmp_path))
    single = SageCogVideoXAttnProcessor(backend="sdpa")
    for rank in range(2):
        outs = torch.load(tmp_path / f"processor-rank{rank}.pt")
        for text, video, rotary, cross in _processor_cases():
            q, k, v, freqs = _processor_qkv(text, video)
            attn = SimpleNamespace(is_cross_attention=cross)
            want = single.attend_projected(attn, q, k, v, None, text, freqs if rotary else None)
            per = (text + video) // 2
            for chunks in (1, 2):
                got = outs[chunks, text, video, rotary, cross]
                assert torch.equal(got, want[:, :, rank * per : (rank + 1) * per]), (chunks, text, rotary, cross, rank)


def test_shards_cover_text_then_video_once():
    from sagevideo.pipelines.cogvideox.sequence_parallel import shard_ranges

    assert [shard_ranges(226, 17550, 2, r) for r in range(2)] == [((0, 226), (0, 8662)), ((226, 226), (8662, 17550))]
    # More ranks than the text fills: the text spans ranks 0 and 1.
    assert [shard_ranges(10, 14, 4, r) for r in range(4)] == [
        ((0, 6), (0, 0)), ((6, 10), (0, 2)), ((10, 10), (2, 8)), ((10, 10), (8, 14))]


def test_other_transformers_are_refused_before_any_rank_communicates():
    """Only CogVideoXTransformer3DModel itself is split (a subclass may change what the hooks split),
    and one transformer: refused in one process without a group, nothing installed."""
    from types import SimpleNamespace

    from diffusers import CogVideoXTransformer3DModel

    from sagevideo.pipelines.cogvideox.sequence_parallel import shard_cogvideox
    from sagevideo.pipelines.cogvideox.tiny import TRANSFORMER_CONFIG
    from tests.helpers.wan import tiny_wan

    class MyCogVideoX(CogVideoXTransformer3DModel):
        pass

    with pytest.raises(TypeError, match=r"shard_cogvideox: the transformer is a WanTransformer3DModel .*splits "
                                        r"CogVideoXTransformer3DModel only"):
        shard_cogvideox(tiny_wan())
    with pytest.raises(TypeError, match=r"the transformer is a MyCogVideoX"):
        shard_cogvideox(MyCogVideoX(**TRANSFORMER_CONFIG))
    first, second = (CogVideoXTransformer3DModel(**TRANSFORMER_CONFIG) for _ in range(2))
    with pytest.raises(TypeError, match=r"holds 2 denoisers \(transformer, transformer_2\); shard_cogvideox splits "
                                        r"one"):
        shard_cogvideox(SimpleNamespace(transformer=first, transformer_2=second))
    assert not hasattr(first, "_sagevideo_attention") and not first._forward_pre_hooks
