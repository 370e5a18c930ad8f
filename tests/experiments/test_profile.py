"""`experiments/profile`: the time split of one denoising step and the Amdahl bounds of each lever."""

import math
import os
import subprocess
import sys

import pytest

from sagevideo.experiments.profile import (
    ProfileConfig,
    amdahl,
    category_of,
    report_from_seconds,
    run_profile,
    split_events,
)


def test_bounds_follow_from_a_synthetic_profile():
    report = report_from_seconds({"attention": 0.6, "linear": 0.3, "rest": 0.1}, model="m", device="cpu", steps=1,
                                 forwards_per_step=1, tokens=1)
    assert math.isclose(sum(report.shares.values()), 1.0)
    assert report.shares["attention"] == pytest.approx(0.6)
    assert report.bounds["attention"]["3x"] == pytest.approx(1 / (0.4 + 0.2))  # 1.667
    assert report.bounds["attention"]["inf"] == pytest.approx(1 / 0.4)
    assert report.bounds["linear"]["2x"] == pytest.approx(1 / (0.7 + 0.15))
    assert amdahl(1.0, math.inf) == math.inf


def test_ops_count_under_their_outermost_classified_caller():
    assert category_of(["aten::scaled_dot_product_attention", "aten::mm"]) == "attention"
    assert category_of(["aten::linear", "aten::addmm"]) == "linear"
    assert category_of(["sagevideo::record_backend"]) == "rest"
    assert category_of(["aten::add"]) == "rest"


def test_a_tiny_step_on_the_cpu(tmp_path, monkeypatch):
    monkeypatch.delenv("KINETO_LOG_LEVEL", raising=False)
    report = run_profile(ProfileConfig(model="tiny-wan", json_out=tmp_path / "p.json", plot=tmp_path / "p.png"))
    assert "KINETO_LOG_LEVEL" not in os.environ  # the quiet level was the profile's only
    assert math.isclose(sum(report.shares.values()), 1.0)
    assert report.shares["attention"] > 0 and report.shares["linear"] > 0
    assert report.forwards_per_step == 2  # Wan runs each guidance branch as its own forward
    for lever in ("attention", "linear"):
        assert report.bounds[lever]["inf"] == pytest.approx(1 / (1 - report.shares[lever]))
    assert (tmp_path / "p.json").stat().st_size > 0 and (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"


def test_unknown_model_is_refused():
    with pytest.raises(ValueError, match="unknown model config"):
        ProfileConfig(model="cogvideox-9b")


def test_kernel_events_are_not_counted_twice():
    """On a GPU the profiler lists each op (CPU side, with its kernels' time as self device time)
    and each kernel again as a device event without a CPU parent; only the op counts."""
    from types import SimpleNamespace

    from torch.autograd import DeviceType

    def event(name, device_us, device_type=DeviceType.CPU, parent=None):
        return SimpleNamespace(name=name, self_device_time_total=device_us, self_cpu_time_total=0.0,
                               cpu_parent=parent, device_type=device_type)

    sdpa = event("aten::scaled_dot_product_attention", 0.0)
    events = [sdpa, event("aten::_cudnn_attention", 800.0, parent=sdpa), event("aten::mm", 700.0),
              event("aten::add", 200.0), event("cudnn_attention_kernel", 800.0, DeviceType.CUDA),
              event("sm90_gemm_kernel", 700.0, DeviceType.CUDA), event("elementwise_kernel", 200.0, DeviceType.CUDA)]
    assert split_events(events, use_device=True) == pytest.approx({"attention": 8e-4, "selection": 0.0,
                                                                   "linear": 7e-4, "rest": 2e-4})


def test_kernels_outside_any_classified_op_count_by_their_names():
    """Under torch.compile no aten op surrounds Inductor's and sagevideo's kernels: each kernel of
    an unclassified op counts by its name; a classified op's kernels stay in its category."""
    from types import SimpleNamespace

    from torch.autograd import DeviceType

    def kernel(name, us):
        return SimpleNamespace(name=name, duration=us)

    graph = SimpleNamespace(name="## Call CompiledFxGraph ##", self_device_time_total=1000.0, self_cpu_time_total=0.0,
                            cpu_parent=None, device_type=DeviceType.CPU,
                            kernels=[kernel("_attn_fwd_sm90_kernel_0", 500.0), kernel("_quantize_q_kernel", 50.0),
                                     kernel("nvjet_tst_256x128_64x4_2x1_v_bz_coopB_TNT", 300.0),
                                     kernel("triton_poi_fused_addmm_gelu_3", 100.0),
                                     kernel("fmha_cutlassF_bf16_aligned_64x128_rf_sm80", 50.0)])
    mm = SimpleNamespace(name="aten::_scaled_mm", self_device_time_total=400.0, self_cpu_time_total=0.0,
                         cpu_parent=None, device_type=DeviceType.CPU, kernels=[kernel("triton_poi_fused_1", 400.0)])
    # CUPTI's bookkeeping event inside the op carries the op's correlation id and its kernels again
    buffer = SimpleNamespace(name="Activity Buffer Request", self_device_time_total=400.0, self_cpu_time_total=0.0,
                             cpu_parent=mm, device_type=DeviceType.CPU, kernels=mm.kernels)
    graph.id, mm.id, buffer.id = 1, 2, 2
    kernels = {}
    assert split_events([graph, mm, buffer], use_device=True, kernels=kernels) == pytest.approx(
        {"attention": 6e-4, "selection": 0.0, "linear": 7e-4, "rest": 1e-4})
    assert kernels["triton_poi_fused_addmm_gelu_3"] == ["rest", pytest.approx(1e-4), 1]
    assert kernels["triton_poi_fused_1"] == ["linear", pytest.approx(4e-4), 1]  # inside aten::_scaled_mm, once


@pytest.mark.parametrize("name, part", [
    # kernel names from `sagevideo profile --model cogvideox-5b --recipe fp8-compile-sage` on the H200
    ("triton_red_fused_abs_amax_gelu_view_22", "linear"),  # the FP8 scales of the GELU's output
    ("triton_red_fused_abs_add_amax_cat_mul_native_layer_norm_split_unsqueeze_3", "linear"),
    ("triton_poi_fused__scaled_mm__to_copy_clamp_div_gelu_t_unsqueeze_view_23", "linear"),
    ("triton_red_fused_add_mul_native_layer_norm_split_split_with_sizes_unsqueeze_view_18", "rest"),
    ("triton_red_fused_native_layer_norm_1", "rest"),
    ("_quantize_kv_kernel", "attention"),
])
def test_fp8_activation_scales_count_as_linears(name, part):
    from sagevideo.experiments.profile import kernel_category

    assert kernel_category(name) == part


@pytest.mark.parametrize("recipe", ["eager-sage", pytest.param("compile-cudnn", marks=pytest.mark.slow)])
def test_a_recipe_on_the_cpu(recipe):
    """The reference attention (eager-sage) is named for the profiler; compile-cudnn's SDPA stays an
    aten op in the compiled graph (the eager compile backend on the CPU)."""
    report = run_profile(ProfileConfig(model="tiny-cogvideox", recipe=recipe, device="cpu"))
    assert report.recipe == recipe and f"recipe {recipe}" in report.table()
    assert 0 < sum(report.seconds.values()) <= 1.02 * report.wall_seconds and "more than the wall" not in report.table()
    # counted at all (0 when the calls went unattributed); how much depends on the machine's load
    assert report.shares["attention"] > 0 and report.shares["linear"] > 0


def test_the_reference_attention_is_named_for_the_profiler():
    import torch
    from torch.profiler import profile

    from sagevideo.attention.functional import REFERENCE_PROFILE_NAME, sageattn

    q, k, v = (torch.randn(1, 2, 64, 32) for _ in range(3))
    with profile() as prof:
        sageattn(q, k, v, backend="reference")
    assert category_of([REFERENCE_PROFILE_NAME]) == "attention"
    assert any(e.name == REFERENCE_PROFILE_NAME and e.cpu_children for e in prof.events())


def test_a_recipe_this_machine_cannot_run_is_refused_before_building(monkeypatch):
    from sagevideo.errors import InputError
    from sagevideo.pipelines import forwards

    monkeypatch.setattr(forwards, "build_step", lambda *a, **k: pytest.fail("built the model"))
    with pytest.raises(InputError, match="--recipe fp8-eager-sage: float8 linears need"):
        run_profile(ProfileConfig(model="tiny-cogvideox", recipe="fp8-eager-sage", device="cpu"))
    with pytest.raises(InputError, match="--recipe compile-sage: on the CPU .* profile eager-sage here"):
        run_profile(ProfileConfig(model="tiny-cogvideox", recipe="compile-sage", device="cpu"))
    with pytest.raises(ValueError, match="is not"):
        ProfileConfig(recipe="compile-fast")


def test_a_recipe_naming_a_cache_runs_in_the_caches_context():
    report = run_profile(ProfileConfig(model="tiny-cogvideox", recipe="eager-cudnn-first-block", device="cpu"))
    assert report.recipe == "eager-cudnn-first-block" and abs(sum(report.shares.values()) - 1) < 1e-9


def test_a_sparse_calls_tile_selection_is_its_own_part():
    """Whatever runs inside the selection range counts as selection, even inside an attention layer."""
    from sagevideo.pipelines.sparse import SELECTION_RANGE

    assert category_of(["aten::scaled_dot_product_attention", SELECTION_RANGE, "aten::mm"]) == "selection"
    assert category_of(["aten::linear", SELECTION_RANGE]) == "selection"
    report = report_from_seconds({"attention": 0.6, "linear": 0.4}, model="m", device="cpu", steps=1,
                                 forwards_per_step=1, tokens=1)
    assert report.seconds["selection"] == 0.0 and report.shares["rest"] == 0.0  # parts never met took no time


@pytest.mark.slow  # two profiles of a 576-token tiny Wan step on the reference emulation
def test_a_sparse_step_on_the_cpu_shows_its_selection():
    report = run_profile(ProfileConfig.build(model="tiny-wan", recipe="eager-sage", sparse="static:0.3", frames=33,
                                             resolution="128x128"))
    assert report.seconds["selection"] > 0 and report.seconds["attention"] > 0
    assert "selection" in report.table()
    dense = run_profile(ProfileConfig.build(model="tiny-wan", recipe="eager-sage", frames=33, resolution="128x128"))
    assert dense.seconds["selection"] == 0.0


@pytest.mark.parametrize(("options", "message"), [
    ({"sparse": "static:0.3"}, "--sparse static:0.3: applies to sage recipes, none named; e.g. --recipe eager-sage"),
    ({"sparse": "static:0.3", "recipe": "eager-cudnn"}, "--sparse static:0.3: applies to sage recipes"),
])
def test_sparse_profiles_are_refused_where_they_cannot_run(options, message):
    from sagevideo.errors import InputError

    with pytest.raises(InputError, match=message):
        run_profile(ProfileConfig.build(model="tiny-wan", **options))


@pytest.mark.slow  # a process of its own: kineto reads its log level once, at its first use in a process
def test_the_profile_keeps_torch_profilers_own_lines_off_stderr():
    """Kineto (torch.profiler's library) writes 'USDT: ... profiler_start' and '... profiler_stop' to
    the process's stderr from C++ at its default log level; the profile's window keeps them back."""
    code = ("import torch\nfrom torch.profiler import profile\n"
            "from sagevideo.experiments.profile import _quiet_kineto\n"
            "with _quiet_kineto(), profile():\n    torch.ones(3) + 1\n")
    env = {k: v for k, v in os.environ.items() if k != "KINETO_LOG_LEVEL"}
    ran = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert ran.returncode == 0, ran.stderr
    assert "profiler_start" not in ran.stderr and "SyncActivityProfilerHandler" not in ran.stderr, ran.stderr
