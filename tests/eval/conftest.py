"""Fixtures for the A/B evaluation tests (helpers in tests/helpers/evalkit.py): synthetic arms, tiny local models,
and evaluations shared by several test modules. Nothing is downloaded."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tests.helpers.evalkit import arm_videos, make_arm, run_eval, single_thread, tiny_clip


@pytest.fixture()
def one_thread():
    """Used by the evaluation test modules (pytestmark), not by the other tests of this folder."""
    with single_thread():
        yield


@pytest.fixture(scope="session")
def arms(tmp_path_factory) -> dict[str, Path]:
    """ref, an identical copy, and noisy test arms at increasing noise levels (sigma 3, 10, 30)."""
    root = tmp_path_factory.mktemp("arms")
    out = {"ref": make_arm(root / "ref", arm_videos())}
    out["same"] = make_arm(root / "same", arm_videos(), attention="full")
    for sigma in (3, 10, 30):
        out[f"noise{sigma}"] = make_arm(
            root / f"noise{sigma}",
            arm_videos(sigma),
            attention="sage",
            pv="fp16",
            backend="reference",
            backends={"counts": {"reference/fp16": 4}, "fallbacks": {}},
        )
    return out


@pytest.fixture(scope="session")
def weights_dir(tmp_path_factory) -> Path:
    """A weights folder with a tiny CLIP and a random AlexNet backbone (no Inception file)."""
    from sagevideo.eval.lpips import backbone_features
    from sagevideo.eval.weights import CLIP_FOLDER, LPIPS_FILES

    root = tmp_path_factory.mktemp("weights")
    tiny_clip(root / CLIP_FOLDER)
    torch.manual_seed(1)
    features = backbone_features("alex")
    (root / "lpips").mkdir()
    torch.save({f"features.{k}": v for k, v in features.state_dict().items()}, root / "lpips" / LPIPS_FILES["alex"])
    return root


@pytest.fixture(scope="session")
def identical(arms, weights_dir, tmp_path_factory):
    """The reference against an identical copy, with the copy as the noise floor too (all metrics)."""
    out = tmp_path_factory.mktemp("identical")
    with single_thread():
        return run_eval(arms["ref"], arms["same"], out, weights_dir, noise=arms["same"]) | {"_out": out}


@pytest.fixture(scope="session")
def by_noise(arms, weights_dir, tmp_path_factory):
    """Evaluations of the noisy arms (sigma 3, 10, 30) against the reference; noise floor = the copy."""
    results = {}
    with single_thread():
        for s in (3, 10, 30):
            out = tmp_path_factory.mktemp(f"n{s}")
            results[s] = run_eval(arms["ref"], arms[f"noise{s}"], out, weights_dir, noise=arms["same"]) | {"_out": out}
    return results
