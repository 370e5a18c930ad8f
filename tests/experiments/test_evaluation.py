"""The evaluation's options (`experiments/evaluation.py`): one config for eval, ab's evaluation, check-weights."""

from __future__ import annotations

import pytest

from sagevideo.errors import InputError
from sagevideo.experiments.evaluation import EvalConfig, EvalSettings, WeightsOptions


def test_settings_become_the_eval_options_they_name(tmp_path):
    options = EvalSettings(metrics=["psnr", "ssim"], weights=tmp_path, device="cpu", lpips_net="vgg", resamples=200,
                           set_resamples=20, diff_gain=4.0).options()
    assert (options.metrics, options.weights, options.device, options.lpips_net) == (["psnr", "ssim"], tmp_path,
                                                                                      "cpu", "vgg")
    assert (options.bootstrap.resamples, options.bootstrap.set_resamples, options.diff_gain) == (200, 20, 4.0)
    assert EvalSettings().options().metrics is None  # no metrics named: all of them


def test_build_names_every_bad_option_at_once(tmp_path):
    with pytest.raises(InputError) as err:
        EvalConfig.build(ref_dir=tmp_path, test_dir=tmp_path, out=tmp_path, resamples=5, lpips_net="resnet")
    assert "resamples" in str(err.value) and "lpips_net" in str(err.value).replace("-", "_")


def test_check_weights_takes_only_the_weights_options():
    assert set(WeightsOptions.model_fields) == {"weights", "lpips_net"}
    assert set(WeightsOptions.model_fields) < set(EvalSettings.model_fields) < set(EvalConfig.model_fields)
