import json

import pytest

from bench import first_call


@pytest.mark.slow  # an end-to-end benchmark run, seconds
def test_times_each_block_of_the_first_call_and_profiles_it(tmp_path, capsys):
    assert first_call.main(["--tiny", "--layers", "2", "--linear", "bf16", "--compile-backend", "eager",
                            "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "first_call.json").read_text())
    # batch 2 in one forward: each of the 2 blocks is called once per forward
    assert len(report["block_first_call_s"]) == 2 and len(report["block_second_call_s"]) == 2
    assert report["first_call_s"] >= sum(report["block_first_call_s"])
    assert report["graph_breaks"] == {}  # the sage attention (a CPU fallback here) traces without a break
    assert (tmp_path / "first_call.prof").stat().st_size > 0
    assert "cumulative" in (tmp_path / "first_call_profile.txt").read_text()
    assert "first_call: 2 blocks" in capsys.readouterr().out
