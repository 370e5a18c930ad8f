"""Ray's driver-side chatter stays off the terminal: raylet error lines and the token-auth notice."""

from __future__ import annotations

import logging

import pytest

pytest.importorskip("ray")

from sagevideo.scheduling.quiet import quiet_ray_driver  # noqa: E402


@pytest.fixture
def quiet(monkeypatch):
    from ray._private import worker as ray_worker

    monkeypatch.setattr(ray_worker, "print_to_stdstream", ray_worker.print_to_stdstream)  # restored afterwards
    logger = logging.getLogger("ray._private.authentication.authentication_token_setup")
    monkeypatch.setattr(logger, "filters", list(logger.filters))
    quiet_ray_driver()
    quiet_ray_driver()  # idempotent: wrapped once
    return ray_worker


def test_raylet_lines_go_to_the_debug_log_and_worker_output_still_prints(quiet, capsys, caplog, monkeypatch):
    died = "\x1b[33m(raylet)\x1b[0m A worker died or was killed while executing a task by an unexpected system error."
    # caplog's handler on the logger itself, enabled: a test run earlier in the same process (in another
    # order under pytest-xdist) may have disabled the logger or cut its way to the root, where caplog listens
    logger = logging.getLogger("sagevideo.ray")
    monkeypatch.setattr(logger, "disabled", False)
    monkeypatch.setattr(logger, "propagate", False)  # each record reaches caplog's handler once
    logger.addHandler(caplog.handler)
    try:
        with caplog.at_level(logging.DEBUG, logger="sagevideo.ray"):
            quiet.print_to_stdstream({"lines": [died], "pid": "raylet", "is_err": False}, ignore_prefix=False)
    finally:
        logger.removeHandler(caplog.handler)
    assert capsys.readouterr().out == ""
    assert caplog.messages == ["raylet: (raylet) A worker died or was killed while executing a task by an unexpected "
                               "system error."]  # without the ANSI colours
    quiet.print_to_stdstream(
        {"lines": ["loaded the model"], "pid": 4242, "ip": "10.0.0.1", "is_err": False, "actor_name": "Worker"},
        ignore_prefix=True,
    )
    assert "loaded the model" in capsys.readouterr().out


def test_the_token_auth_notice_is_dropped_other_ray_warnings_are_not(quiet, caplog):
    logger = logging.getLogger("ray._private.authentication.authentication_token_setup")
    with caplog.at_level(logging.WARNING, logger=logger.name):
        logger.warning("Token authentication is enabled for this Ray cluster. Set RAY_AUTH_MODE=disabled to opt out.")
        logger.warning("Token authentication is disabled for this Ray cluster. Anyone with network access ...")
    assert caplog.messages == ["Token authentication is disabled for this Ray cluster. Anyone with network access ..."]
