"""Pairing two output folders through their manifests: clear refusals."""

from __future__ import annotations

import pytest

from sagevideo.eval.evaluate import plan_pairs
from sagevideo.eval.pairing import PairingError
from sagevideo.outputs.manifest import Manifest
from tests.helpers.evalkit import base_video, make_arm

pytestmark = pytest.mark.usefixtures("one_thread")


def small(index: int, frames: int = 5, size: int = 32):
    return base_video(index, frames=frames, size=size)


@pytest.fixture(scope="module")
def ref(tmp_path_factory):
    root = tmp_path_factory.mktemp("pairing")
    return make_arm(root / "ref", [("fox", 0, small(0)), ("lighthouse", 0, small(1)), ("beach", 1, small(2))])


def test_pairs_by_prompt_and_seed_in_reference_order(ref, tmp_path):
    test = make_arm(tmp_path / "test", [("beach", 1, small(2)), ("fox", 0, small(0)), ("lighthouse", 0, small(1))])
    pairs, arms = plan_pairs(ref, test)
    assert [(p.prompt, p.seed) for p in pairs] == [("fox", 0), ("lighthouse", 0), ("beach", 1)]
    assert all(p.ref.frames == 5 and (p.ref.height, p.ref.width) == (32, 32) for p in pairs)


def test_every_mismatch_is_listed(ref, tmp_path):
    test = make_arm(
        tmp_path / "test",
        [
            ("fox", 0, small(0, frames=9)),  # frame count differs
            ("lighthouse", 0, small(1, size=48)),  # size differs
            ("beach", 2, small(2)),  # other seed: missing (beach, 1) and extra (beach, 2)
        ],
    )
    with pytest.raises(PairingError) as err:
        plan_pairs(ref, test)
    text = str(err.value)
    assert "'fox' seed 0: 9 frames, REF_DIR has 5" in text
    assert "'lighthouse' seed 0: 48x48 px, REF_DIR has 32x32" in text
    assert "1 video(s) of REF_DIR have no partner (same prompt, seed and image): 'beach' seed 1" in text
    assert "1 video(s) are not in REF_DIR: 'beach' seed 2" in text
    assert "same prompts and seeds" in text


def test_failed_jobs_and_missing_files_do_not_pair(ref, tmp_path):
    test = make_arm(tmp_path / "test", [("fox", 0, small(0)), ("lighthouse", 0, small(1)), ("beach", 1, small(2))])
    records = Manifest(test / "manifest.jsonl").records()
    Manifest(test / "manifest.jsonl").append(dict(records[1], status="failed", error="boom"))  # latest: failed
    (test / records[2]["outputs"][0]).unlink()  # done but its file is gone
    with pytest.raises(PairingError, match=r"2 video\(s\) of REF_DIR have no partner"):
        plan_pairs(ref, test)


def test_noise_floor_arm_is_checked_too(ref, tmp_path):
    test = make_arm(tmp_path / "test", [("fox", 0, small(0)), ("lighthouse", 0, small(1)), ("beach", 1, small(2))])
    noise = make_arm(tmp_path / "noise", [("fox", 0, small(0)), ("lighthouse", 0, small(1))])
    with pytest.raises(PairingError, match=r"--noise-ref: 1 video\(s\) of REF_DIR have no partner"):
        plan_pairs(ref, test, noise)


def test_duplicates_no_manifest_and_no_folder(ref, tmp_path):
    dup = make_arm(tmp_path / "dup", [("fox", 0, small(0)), ("fox", 0, small(1))])
    with pytest.raises(PairingError, match=r"two finished videos for 'fox' seed 0 \(job ids job0-0 and job1-0"):
        plan_pairs(ref, dup)
    (tmp_path / "plain").mkdir()
    with pytest.raises(PairingError, match="no manifest.jsonl"):
        plan_pairs(ref, tmp_path / "plain")
    with pytest.raises(PairingError, match="no such folder"):
        plan_pairs(tmp_path / "nowhere", ref)
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "manifest.jsonl").write_text("")
    with pytest.raises(PairingError, match="no finished video"):
        plan_pairs(ref, empty)
