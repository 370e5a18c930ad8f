"""`sagevideo.generate` (plan, then run) end to end on the tiny model: the files and records a default batch makes."""

import json
import os
import re
import socket

import imageio.v2 as imageio
import numpy as np
import pytest

import sagevideo
from sagevideo.jobs.specs import DEFAULT_PROMPTS

RECORD_FIELDS = set(
    "schema job_id status error prompt negative_prompt seed frames height width steps guidance name model family "
    "model_fingerprint attention pv backend plan plan_sha256 sparse image image_sha256 device dtype fps backends "
    "timings outputs attempts retries worker started created sagevideo_version recipe scheduler render_key "
    "reused".split()
)


def count_frames(path):
    with imageio.get_reader(path) as reader:  # iterate: list(reader) raises MemoryError
        shapes = [frame.shape for frame in reader]
    return len(shapes), shapes[0]


def manifest_lines(out):
    return [json.loads(line) for line in (out / "manifest.jsonl").read_text().splitlines()]


def test_default_batch_end_to_end(tmp_path):
    out = tmp_path / "out"
    records = sagevideo.generate(out=out, progress=False)
    assert [r["prompt"] for r in records] == list(DEFAULT_PROMPTS)
    assert manifest_lines(out) == records
    for r in records:
        assert set(r) == RECORD_FIELDS
        assert r["status"] == "done" and r["error"] is None
        assert (r["frames"], r["height"], r["width"], r["steps"], r["model"]) == (9, 64, 64, 2, "tiny")
        # CPU + backend auto runs the emulation of the quantized kernels, not the SDPA fallback
        assert (r["attention"], r["backend"], r["pv"], r["device"]) == ("sage", "reference", "fp16", "cpu")
        assert r["backends"] == {"counts": {"reference/fp16": 4}, "fallbacks": {}}  # 2 layers x 2 steps
        phases = ("load_s", "denoise_s", "first_step_s", "decode_s", "write_s")
        assert all(isinstance(r["timings"][k], float) for k in phases)
        assert r["sagevideo_version"] == sagevideo.__version__
        assert (r["attempts"], r["retries"], r["plan"], r["plan_sha256"]) == (1, [], None, None)
        assert r["started"] <= r["created"] and r["started"].endswith("+00:00")
        assert r["worker"] == {"host": socket.gethostname(), "pid": os.getpid(), "node": None}
        (name,) = r["outputs"]
        assert re.fullmatch(r"[a-z0-9-]+-[0-9a-f]{10}\.mp4", name) and name.endswith(
            r["job_id"][:10] + ".mp4"
        )
        assert count_frames(out / name) == (9, (64, 64, 3))
    assert sorted(os.listdir(out)) == sorted(["manifest.jsonl", *(r["outputs"][0] for r in records)])


def test_the_mp4_rate_is_the_models_unless_fps_is_given(tmp_path):
    from sagevideo.generation.plan import plan_batch

    source_fps = plan_batch(["a fox"], out=tmp_path / "a").settings.fps
    assert source_fps == 8  # CogVideoX's tiny model: CogVideoX is trained at 8 fps
    assert plan_batch(["a fox"], out=tmp_path / "b", fps=24).settings.fps == 24


def test_a_recipe_runs_through_generate_and_is_recorded_in_the_manifest(tmp_path):
    out = tmp_path / "out"
    recipe = sagevideo.Recipe(cache="first-block", cache_threshold=5.0, compile="regional", compile_backend="eager")
    (record,) = sagevideo.generate("a red panda", out=out, steps=3, recipe=recipe, progress=False)
    assert record["status"] == "done", record["error"]
    assert manifest_lines(out) == [record]
    got = record["recipe"]
    assert (got["cache"], got["cache_threshold"], got["compile"], got["compiled_blocks"]) == (
        "first-block", 5.0, "regional", 2)
    assert (got["cache_forwards"], got["cache_skipped"]) == (3, 2)  # the steps after the first reuse the cache
    assert record["timings"]["recipe_s"] > 0  # applying it is charged to the job it was applied for
    assert record["backends"]["counts"] == {"reference/fp16": 2 * 3 - 2}  # 2 layers, skipped steps run only block 0
    plain = sagevideo.generate("a red panda", out=tmp_path / "plain", steps=3, progress=False)[0]
    assert plain["recipe"] is None and plain["job_id"] != record["job_id"]  # a cache changes the video: its own id


def test_sparse_off_plans_the_batch_that_leaving_it_out_plans(tmp_path):
    from sagevideo.generation.plan import plan_batch

    plain = plan_batch(["a fox"], out=tmp_path / "a")
    off = plan_batch(["a fox"], out=tmp_path / "b", sparse="off")
    assert [j.job for j in off.jobs] == [j.job for j in plain.jobs] and off.jobs[0].job.sparse == "off"
    assert [j.job_id for j in off.jobs] == [j.job_id for j in plain.jobs]
    on = plan_batch(["a fox"], out=tmp_path / "c", sparse="dynamic:0.15")
    assert on.jobs[0].job.sparse == "dynamic:0.15" and on.jobs[0].job_id != plain.jobs[0].job_id


@pytest.mark.slow  # two tiny videos
def test_sparse_off_makes_the_same_video_bit_for_bit(tmp_path):
    plain = sagevideo.generate("a red panda", out=tmp_path / "plain", progress=False)[0]
    off = sagevideo.generate("a red panda", out=tmp_path / "off", progress=False, sparse="off")[0]
    assert off["job_id"] == plain["job_id"] and off["sparse"] is None and "sparse" not in off["backends"]
    frames = [np.stack(imageio.mimread(tmp_path / name / r["outputs"][0])) for name, r in (("plain", plain),
                                                                                          ("off", off))]
    assert np.array_equal(*frames)


@pytest.mark.slow  # the quantization emulation at 658 tokens
def test_sparse_runs_through_generate_and_is_recorded_per_layer_and_step(tmp_path):
    out = tmp_path / "out"
    (record,) = sagevideo.generate("a red panda", out=out, steps=3, height=192, width=192, sparse="static:0.3",
                                   progress=False)
    assert record["status"] == "done", record["error"]
    assert manifest_lines(out) == [record] and record["sparse"] == "static:0.3"
    assert record["backends"]["counts"] == {"reference/fp16": 6} and record["backends"]["fallbacks"] == {}
    sparse = record["backends"]["sparse"]
    assert sparse["layers"]["transformer_blocks.0.attn1"] == {"calls": 3, "density": 1.0, "min": 1.0}
    assert sparse["layers"]["transformer_blocks.1.attn1"]["min"] < 1.0
    assert sparse["steps"]["0"] == 1.0 and sparse["steps"]["1"] < 1.0 and sparse["dense"] == {}


@pytest.mark.slow  # the quantization emulation at 658 tokens
def test_a_sparse_setting_with_reuse_attends_on_kept_lists_between_selections_and_records_them(tmp_path):
    """`--sparse dynamic:0.3:reuse2` over 3 steps: step 0 dense (the first fifth), then each sparse layer
    selects at step 1 and attends on step 1's lists at step 2 (the tiny CogVideoX batches guidance in
    one forward a step): one reused call per sparse layer in the manifest."""
    (record,) = sagevideo.generate("a red panda", out=tmp_path / "out", steps=3, height=192, width=192,
                                   sparse="dynamic:0.3:reuse2", progress=False)
    assert record["status"] == "done", record["error"]
    assert record["sparse"] == "dynamic:0.3:reuse2"
    layers = record["backends"]["sparse"]["layers"]
    assert "reused" not in layers["transformer_blocks.0.attn1"]  # kept dense: the first sparse layer
    assert layers["transformer_blocks.1.attn1"]["sparse_calls"] == 2 and layers["transformer_blocks.1.attn1"][
        "reused"] == 1


@pytest.mark.slow  # the quantization emulation at 658 tokens, twice
def test_a_compiled_sparse_run_records_the_eager_runs_densities_per_layer_and_step(tmp_path):
    """`generate --compile regional --sparse static:0.3`: compiled blocks note each call as eager ones do
    (each layer's statistics on the device, read at the end of each forward), so the manifest's
    `backends.sparse` is the eager run's."""
    options = dict(steps=3, height=192, width=192, sparse="static:0.3", progress=False)
    (eager,) = sagevideo.generate("a red panda", out=tmp_path / "eager", **options)
    recipe = sagevideo.Recipe(compile="regional", compile_backend="eager")
    (compiled,) = sagevideo.generate("a red panda", out=tmp_path / "compiled", recipe=recipe, **options)
    assert compiled["status"] == "done", compiled["error"]
    assert compiled["recipe"]["compiled_blocks"] == 2 and compiled["sparse"] == "static:0.3"
    sparse = compiled["backends"]["sparse"]
    assert sparse == eager["backends"]["sparse"]
    assert sparse["layers"]["transformer_blocks.0.attn1"] == {"calls": 3, "density": 1.0, "min": 1.0}
    assert 0 < sparse["layers"]["transformer_blocks.1.attn1"]["sparse_density"] < 1.0
