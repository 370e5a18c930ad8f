"""bench/bench_startup.py: each start-up part times itself in a new process."""

from pathlib import Path

import pytest

from bench import bench_startup


def test_each_part_is_code_a_fresh_process_can_run():
    for name, (setup, part) in bench_startup.parts(Path("/models/cogvideox"), "cuda").items():
        compile(bench_startup._TIMED.format(setup=setup, part=part, sync=""), name, "exec")
    assert set(bench_startup.parts(Path("m"), "cpu")) >= {"device context", "load, placed directly"}


def test_a_part_reports_the_seconds_its_own_process_measured():
    seconds = bench_startup.run_part("import time", "time.sleep(0.2)", "cpu")
    assert 0.2 <= seconds < 5


def test_a_failing_part_stops_the_run_with_its_error():
    with pytest.raises(SystemExit, match="ZeroDivisionError"):
        bench_startup.run_part("", "1 / 0", "cpu")


def test_a_folder_without_a_model_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit):
        bench_startup.main(["--model", str(tmp_path)])
    assert "no model_index.json" in capsys.readouterr().err
