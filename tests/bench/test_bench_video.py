"""bench/bench_video.py: a whole video per arm through the product, on the built-in tiny model (CPU)."""

import json

import pytest

from bench import bench_video
from bench.results import load, select


def test_ratios_are_stock_over_each_arm():
    arms = {"stock": {"video_s": 90.0, "steady_step_s": 1.8}, "sage": {"video_s": 45.0, "steady_step_s": 0.9},
            "sage-cache": {"video_s": 30.0, "steady_step_s": None}}
    found = bench_video.ratios(arms)
    assert found == {"sage_x_stock_video": 2.0, "sage_x_stock_steady_step": 2.0, "sage-cache_x_stock_video": 3.0}


def test_unknown_arm_is_refused(capsys):
    with pytest.raises(SystemExit) as exc:
        bench_video.main(["--tiny", "--arms", "sage,fastest"])
    assert exc.value.code == 2 and "'fastest' is not one of" in capsys.readouterr().err


def test_the_edges_arm_needs_fp8_linears_in_the_recipe(capsys):
    with pytest.raises(SystemExit) as exc:
        bench_video.main(["--tiny", "--arms", "sage-edges"])
    assert exc.value.code == 2 and "--arms sage-edges: runs steps in bf16 beside FP8 linears" in capsys.readouterr().err


@pytest.mark.slow  # an end-to-end benchmark run, seconds
def test_tiny_video_per_arm_on_cpu(tmp_path, capsys):
    out = tmp_path / "video.json"
    results = tmp_path / "results.jsonl"
    code = bench_video.main(["--tiny", "--steps", "2", "--videos", "2", "--arms", "sage,stock",
                             "--work", str(tmp_path / "w"), "--json", str(out), "--append-results", str(results)])
    assert code == 0
    report = json.loads(out.read_text())
    sage, stock = report["arms"]["sage"], report["arms"]["stock"]
    # the sage arm went through sagevideo.generate: its record says which attention ran and the recipe applied
    assert sage["backends"]["counts"] == {"reference/fp16": 4} and sage["backends"]["fallbacks"] == {}
    assert sage["recipe"]["compile"] == "regional" and sage["recipe"]["compiled_blocks"] == 2
    assert 0 < sage["first_step_s"] < sage["video_s"] and stock["frames_finite"]
    # stock's steps end at its last step's callback: the decode after it is not in its steady step
    assert stock["decode_s"] > 0 and stock["first_step_s"] + stock["steady_step_s"] + stock["decode_s"] == \
        pytest.approx(stock["video_s"])
    assert report["ratios"]["sage_x_stock_video"] == pytest.approx(stock["video_s"] / sage["video_s"])
    # the second video of the call pays no compilation: its first step is a steady one
    later = sage["later_records"][0]["timings"]
    assert sage["later_video_s"] == pytest.approx(later["denoise_s"] + later["decode_s"])
    assert later["first_step_s"] < sage["first_step_s"] and "recipe_s" not in later and sage["recipe_s"] > 0
    rows = load(results)
    assert {r.variant for r in select(rows, metric="video_s")} == {"sage", "stock"}
    assert select(rows, variant="sage", metric="x_stock_video")[0].value == pytest.approx(
        report["ratios"]["sage_x_stock_video"])
    assert "sage_x_stock_video" in capsys.readouterr().out


@pytest.mark.slow  # an end-to-end benchmark run, seconds
def test_the_noise_first_arm_is_stock_with_sagevideos_scheduler(tmp_path):
    out = tmp_path / "video.json"
    assert bench_video.main(["--tiny", "--steps", "3", "--arms", "stock,stock-noise-first,sage", "--videos", "1",
                             "--work", str(tmp_path / "w"), "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    schedulers = {name: arm["scheduler"] for name, arm in report["arms"].items()}
    assert schedulers == {"stock": "CogVideoXDPMScheduler", "stock-noise-first": "NoiseFirstDPMScheduler",
                          "sage": "NoiseFirstDPMScheduler"}
    assert report["arms"]["stock-noise-first"]["attention"] == "SDPA"
    assert report["ratios"]["stock-noise-first_x_stock_video"] > 0


@pytest.mark.slow  # two bench runs of tiny videos (9 s)
def test_a_second_run_in_the_same_work_folder_measures_afresh(tmp_path):
    """An arm's output folder is new each run: generate would otherwise skip the jobs the first
    run made and the arm would report that run's timings. The second worker's start-up comes from
    its record, below the wall-clock bound."""
    work = tmp_path / "w"
    common = ["--tiny", "--steps", "1", "--videos", "1", "--work", str(work)]
    assert bench_video.main([*common, "--arms", "sage", "--json", str(tmp_path / "a.json")]) == 0
    assert bench_video.main([*common, "--arms", "sage,second-worker", "--json", str(tmp_path / "b.json")]) == 0
    manifests = sorted(work.glob("out-sage-*/manifest.jsonl"))
    assert len(manifests) == 2 and all(len(m.read_text().splitlines()) == 1 for m in manifests)
    worker = json.loads((tmp_path / "b.json").read_text())["arms"]["second-worker"]
    assert worker["to_first_step_s"] == worker["timings"]["process_to_first_step_s"]
    assert worker["load_s"] < worker["to_first_step_s"] < worker["to_first_step_bound_s"]
    assert 0 < worker["to_load_s"] < worker["to_first_step_s"] - worker["load_s"]


def test_the_stock_arm_can_profile_its_steps_for_a_diagnosis(tmp_path, capsys):
    out = tmp_path / "video.json"
    assert bench_video.main(["--tiny", "--arms", "stock", "--steps", "3", "--profile-steps", "2",
                             "--work", str(tmp_path / "w"), "--json", str(out)]) == 0
    stock = json.loads(out.read_text())["arms"]["stock"]
    assert stock["profiled"] and stock["step_gap"]["steps"] == 2 and stock["step_gap"]["gaps"]
    assert "stock (profiled, timings include the profiler): profiled 2 steps" in capsys.readouterr().out


def test_a_profiled_run_adds_no_rows(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        bench_video.main(["--tiny", "--arms", "stock", "--profile-steps", "1", "--append-results", str(tmp_path / "r")])
    assert exc.value.code == 2 and "--profile-steps is a diagnosis" in capsys.readouterr().err


@pytest.mark.slow  # one tiny video, sparse
def test_the_sparse_arm_runs_a_block_sparse_plan(tmp_path):
    path = tmp_path / "r.json"
    assert bench_video.main(["--tiny", "--steps", "3", "--videos", "1", "--arms", "sage-sparse", "--sparse",
                             "static:0.5", "--recipe", "compile=none", "--work", str(tmp_path),
                             "--json", str(path)]) == 0
    arm = json.loads(path.read_text())["arms"]["sage-sparse"]
    layers = arm["backends"]["sparse"]["layers"]
    # the first sparse layer stays dense; the other one runs the plan's sparse calls after the first step
    assert layers["transformer_blocks.1.attn1"]["sparse_calls"] == 2 and arm["video_s"] > 0


def test_a_model_folder_of_another_family_than_the_config_is_refused(tmp_path, capsys):
    from sagevideo.pipelines.wan.tiny import tiny_pipeline

    tiny_pipeline().save_pretrained(tmp_path, safe_serialization=True)
    with pytest.raises(SystemExit) as exc:
        bench_video.main(["--model", str(tmp_path), "--arms", "stock"])
    assert exc.value.code == 2 and "is a wan folder; give --config wan-14b" in capsys.readouterr().err


def test_the_noise_first_arm_is_refused_for_wan(capsys):
    with pytest.raises(SystemExit) as exc:
        bench_video.main(["--tiny", "--config", "wan-14b", "--arms", "stock-noise-first"])
    assert exc.value.code == 2 and "that scheduler is CogVideoX's" in capsys.readouterr().err


@pytest.mark.slow  # an end-to-end benchmark run, seconds
def test_a_wan_video_runs_stock_and_a_sparse_plan_whose_first_fifth_of_steps_is_dense(tmp_path):
    """--config wan-14b on the tiny Wan: stock is diffusers' WanPipeline (VAE in float32, as its
    examples load it); sage-sparse goes through generate, its first step of five dense (256 px: 768
    video tokens, several key tiles, so a window keeps fewer than all)."""
    path = tmp_path / "r.json"
    assert bench_video.main(["--tiny", "--config", "wan-14b", "--steps", "5", "--height", "256", "--width", "256",
                             "--videos", "1", "--arms",
                             "stock,sage-sparse", "--sparse", "static:0.5", "--recipe", "compile=none",
                             "--work", str(tmp_path), "--json", str(path)]) == 0
    report = json.loads(path.read_text())
    stock, sparse = report["arms"]["stock"], report["arms"]["sage-sparse"]
    assert (report["shape"], stock["pipeline"], stock["scheduler"]) == ("wan-tiny", "WanPipeline",
                                                                        "UniPCMultistepScheduler")
    assert stock["frames_finite"] and sparse["video_s"] > 0
    steps = sparse["backends"]["sparse"]["steps"]
    assert len(steps) == 5 and list(steps.values())[0] == 1.0 and min(steps.values()) < 1.0, steps
