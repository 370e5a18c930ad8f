"""Named failpoints: parsed from one variable (or `arm`), checked by point, prompt, attempt and rank."""

from __future__ import annotations

import pytest

from sagevideo.host import failpoints


@pytest.fixture(autouse=True)
def environment_decides(monkeypatch):
    monkeypatch.delenv(failpoints.ENV, raising=False)
    failpoints.disarm()
    yield
    failpoints.disarm()


def test_rules_can_target_a_rank_and_count_attempts(monkeypatch):
    monkeypatch.setenv(failpoints.ENV, "mid-denoise=KILL:2@1,other")
    fires = failpoints.fires
    assert fires("mid-denoise", "KILL this", 2, rank=1) and not fires("mid-denoise", "KILL this", 3, rank=1)
    assert not fires("mid-denoise", "KILL this", 1, rank=0)
    assert fires("mid-denoise", "the other one", 1, rank=0) and fires("mid-denoise", "the other one", 1, rank=3)
    assert not fires("mid-denoise", "the other one", 2)
    assert not fires("job-staged", "KILL this", 1, rank=1)  # another point: not armed


def test_arm_overrides_the_environment_and_is_handed_on(monkeypatch):
    monkeypatch.setenv(failpoints.ENV, "job-staged=from env")
    assert failpoints.armed() == "job-staged=from env"
    failpoints.arm("job-staged=KILL ONCE:1; mid-denoise=x@1")
    assert failpoints.armed() == "job-staged=KILL ONCE:1; mid-denoise=x@1"  # what workers get
    assert failpoints.fires("job-staged", "KILL ONCE a fox", 1) and not failpoints.fires("job-staged", "from env", 1)
    assert failpoints.fires("mid-denoise", "x", 1, rank=1)
    failpoints.arm(None)
    assert failpoints.armed() is None and not failpoints.fires("job-staged", "KILL ONCE a fox", 1)
    failpoints.disarm()
    assert failpoints.fires("job-staged", "from env", 1)


def test_unknown_points_are_refused():
    with pytest.raises(ValueError, match="is not POINT=RULE with POINT one of"):
        failpoints.arm("after-decode=KILL")
    with pytest.raises(ValueError, match="is not POINT=RULE"):
        failpoints.arm("KILL:1@1")  # the old SAGEVIDEO_TEST_KILL_WORKER form names no point
    with pytest.raises(ValueError, match="unknown failpoint"):
        failpoints.fires("nowhere", "p", 1)


def test_check_leaves_the_process_only_when_armed(monkeypatch):
    exits = []
    monkeypatch.setattr(failpoints, "exit_now", lambda: exits.append(1))
    failpoints.check("job-staged", "KILL", 1)
    failpoints.arm("job-staged=KILL")
    failpoints.check("job-staged", "no match", 1)
    failpoints.check("job-staged", "KILL", 1)
    assert exits == [1]
