"""metrics.json (strict JSON, versioned) and report.html (parses, every link exists, plays in Chromium)."""

from __future__ import annotations

import json
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

pytestmark = pytest.mark.usefixtures("one_thread")


class Links(HTMLParser):
    def __init__(self):
        super().__init__()
        self.links: list[str] = []
        self.tags: list[str] = []
        self.videos = 0

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        attrs = dict(attrs)
        self.videos += tag == "video"
        for key in ("src", "href"):
            if attrs.get(key):
                self.links.append(attrs[key])


def parse(out: Path) -> Links:
    parser = Links()
    parser.feed((out / "report.html").read_text(encoding="utf-8"))
    parser.close()
    return parser


def strict_json(path: Path):
    def refuse(name):
        raise ValueError(f"non-standard JSON constant {name}")

    return json.loads(path.read_text(encoding="utf-8"), parse_constant=refuse)


def test_metrics_json_is_strict_and_stable(by_noise):
    out = by_noise[10]["_out"]
    data = strict_json(out / "metrics.json")
    assert data["schema"] == "sagevideo.eval.metrics" and data["schema_version"] == 1
    for key in ("arms", "pairs", "n_pairs", "bootstrap", "metrics", "skipped", "verdicts", "notes", "versions"):
        assert key in data
    for entry in data["metrics"].values():
        for key in ("name", "kind", "higher_is_better", "n", "difference", "noise_floor", "excess", "verdict"):
            assert key in entry
        assert len(entry["difference"]["ci95"]) == 2
    assert set(data["arms"]) == {"ref", "test", "noise"}
    assert data["arms"]["test"]["settings"]["backends_ran"] == {"reference/fp16": 12}
    assert data["bootstrap"]["resamples"] == 200


def test_identical_psnr_is_written_as_the_string_inf(identical):
    data = strict_json(identical["_out"] / "metrics.json")
    assert data["metrics"]["psnr"]["difference"]["mean"] == "inf"


def test_report_parses_and_every_link_exists(by_noise):
    out = by_noise[30]["_out"]
    page = parse(out)
    assert page.videos == 3 * 3  # reference | test | difference, per prompt
    assert "metrics.json" in page.links
    for link in page.links:
        assert not link.startswith(("/", "http:", "https:", "file:")), link  # relative links only
        assert (out / link).is_file(), link
    text = (out / "report.html").read_text(encoding="utf-8")
    assert "beyond the noise floor (worse)" in text and "Versions" in text and "torchmetrics" in text


@pytest.mark.skipif(shutil.which("chromium") is None, reason="chromium not installed (apt-get install chromium)")
def test_report_renders_and_videos_load_in_headless_chromium(by_noise, tmp_path):
    """Every <video> reports data-state="loaded" (set by the page's script on loadeddata)."""
    out = by_noise[3]["_out"]
    dom = subprocess.run(
        [
            "chromium",
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--virtual-time-budget=5000",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            "--disable-default-apps",
            "--disable-extensions",
            "--disable-domain-reliability",
            f"--user-data-dir={tmp_path / 'profile'}",
            "--dump-dom",
            (out / "report.html").resolve().as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=90,
        check=True,
    ).stdout
    assert "Verdicts" in dom
    states = [part.split('"', 1)[0] for part in dom.split('data-state="')[1:]]
    assert states == ["loaded"] * 9, states
