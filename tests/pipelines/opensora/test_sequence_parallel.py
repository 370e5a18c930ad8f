"""Open-Sora 2.0 under Ulysses sequence parallelism through the product: a `--model tiny-opensora`
batch over 2 gloo ranks, as `sagevideo generate --gpus-per-job 2 --device cpu` runs it in each rank
(tests/helpers/torchrun_ranks.py), against this process.

Tolerance (`tests/helpers/sp_tolerance.py`, the CogVideoX test's): with attention "full" the mp4
is byte-identical; with sagevideo's quantized attention the decoded frames agree to a mean of
MEAN_LEVELS (1.5) levels of 255 (a ~1e-6 change in Q or K from the sharded linear layers can flip
one INT8 rounding). The transformer alone (2 ranks vs 1, 1e-5) is tests/parallel/test_ulysses.py.
The image-to-video job runs full attention, so its byte-identical mp4 checks the sharded condition
(`cond` is split with the image tokens) exactly.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

import sagevideo
from tests.helpers.sp_tolerance import MEAN_LEVELS, frames
from tests.helpers.torchrun_ranks import torchrun_on_two_ranks


def manifest(out):
    """The records of a batch folder by their video's file name."""
    lines = (out / "manifest.jsonl").read_text().splitlines()
    return {r["outputs"][0]: r for r in map(json.loads, lines)}


@pytest.mark.slow  # two batches: this process, then 2 gloo ranks
def test_two_ranks_make_the_one_process_videos(tmp_path, two_ranks):
    """Open-Sora's Ulysses processors over 2 gloo ranks, text-to-video and image-to-video, make this
    process's videos. What no family decides is tested once elsewhere: Ray groups of ranks, and a
    killed rank restarting its group (tests/scheduling/test_group.py)."""
    still = tmp_path / "still.png"
    Image.fromarray((np.random.default_rng(0).random((64, 112, 3)) * 255).astype(np.uint8)).save(still)
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(
        "defaults:\n  steps: 2\njobs:\n"
        "  - prompt: a cat on a red sofa\n    output: sage\n"
        "  - prompt: a dog in the snow\n    output: full\n    attention: full\n"
        f"  - prompt: a fox at dusk\n    output: i2v\n    image: {still}\n    attention: full\n"
    )
    one = {r["outputs"][0]: r for r in sagevideo.generate(jobs, model="tiny-opensora", out=tmp_path / "one",
                                                          device="cpu", progress=False)}
    assert sorted(one) == ["full.mp4", "i2v.mp4", "sage.mp4"]

    args = [str(jobs), "--model", "tiny-opensora", "--device", "cpu", "--no-progress", "--out", str(tmp_path / "sp")]
    ranks = torchrun_on_two_ranks(two_ranks, args, tmp_path / "logs")
    assert [rank["code"] for rank in ranks] == [0, 0], ranks[0]["stderr"]
    assert "3 done, 0 skipped, 0 failed" in ranks[0]["stdout"]
    sharded = manifest(tmp_path / "sp")
    for name in ("full.mp4", "i2v.mp4"):
        assert (tmp_path / "sp" / name).read_bytes() == (tmp_path / "one" / name).read_bytes(), name
    a, b = frames(tmp_path / "sp" / "sage.mp4"), frames(tmp_path / "one" / "sage.mp4")
    assert a.shape == b.shape == (9, 64, 112, 3) and np.abs(a - b).mean() <= MEAN_LEVELS
    for name, record in sharded.items():
        assert record["status"] == "done" and record["family"] == "opensora" and record["fps"] == 24
        assert record["worker"]["ranks"] == 2 and record["job_id"] == one[name]["job_id"]
        # every attention call of a job (2 layers x 2 steps) counted by rank 0, as one process counts them;
        # with attention "full" one process installs nothing, while Ulysses runs SDPA in its own processors
        want = {"sdpa": 4} if record["attention"] == "full" else one[name]["backends"]["counts"]
        assert record["backends"]["counts"] == want, name
    assert sharded["i2v.mp4"]["image_sha256"] == one["i2v.mp4"]["image_sha256"]


def test_other_transformers_are_refused_before_any_rank_communicates():
    from sagevideo.pipelines.opensora.sequence_parallel import shard_opensora
    from tests.helpers.wan import tiny_wan

    model = tiny_wan()
    with pytest.raises(TypeError, match=r"shard_opensora: the transformer is a WanTransformer3DModel .*splits "
                                        r"OpenSoraTransformer3DModel only"):
        shard_opensora(model)
    assert not hasattr(model, "_sagevideo_attention")
