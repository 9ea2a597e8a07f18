"""The benchmarks page's charts: ``benchmarks/record.py`` writes a benchmark's JSON document,
``benchmarks/charts.py`` draws it, and every document committed under docs/benchmarks/data/
is sound, drawn, and shown on docs/benchmarks.md beside the command that measured it.

matplotlib comes with the ``dev`` extra of the README's install command: it is imported
plainly, so that an environment without it fails here rather than skipping.
"""

from __future__ import annotations

import json
import pathlib
import re

import matplotlib  # noqa: F401 - the docs extra; a missing one is a failure, not a skip
import pytest

from benchmarks import charts
from benchmarks.record import SCHEMA, Record, load

ROOT = pathlib.Path(__file__).resolve().parents[1]
DATA = ROOT / "docs" / "benchmarks" / "data"
IMAGES = ROOT / "docs" / "img" / "benchmarks"
PAGE = ROOT / "docs" / "benchmarks.md"
PNG = b"\x89PNG\r\n\x1a\n"


def test_a_record_is_written_loaded_and_drawn(tmp_path):
    record = Record("feed", {"rows": 1000, "spark_master": "local[2]"},
                    argv=["--rows", "1000", "--json", "feed.json"])
    chart = "MNIST-like rows, fed for training"
    record.add("rows/s", "rows/s", [400_000], peer="in-process limit", case="mnist", chart=chart,
               reference=True)
    record.add("rows/s", "rows/s", [404_875], peer="duotf", backend="spark", case="mnist",
               chart=chart, label="array<float> DataFrame (default)")
    record.add("rows/s", "rows/s", [2_515], peer="TensorFlowOnSpark 2.2.5", backend="spark",
               case="mnist", chart=chart)
    record.add("seconds", "s", [0.5, 0.25, 0.75], peer="duotf", backend="local",
               case="startup", chart="startup")
    path = tmp_path / "feed.json"
    record.write(str(path))

    doc = load(str(path))
    assert doc["schema"] == SCHEMA and doc["benchmark"] == "feed"
    assert doc["command"] == "python -m benchmarks.feed --rows 1000 --json feed.json"
    assert doc["machine"]["cpus"] >= 1 and "python" in doc["machine"]
    assert doc["rows"][3]["values"] == [0.5, 0.25, 0.75] and doc["rows"][3]["median"] == 0.5

    written = charts.draw_all([str(path)], str(tmp_path / "img"))
    assert sorted(pathlib.Path(p).name for p in written) == [
        "feed-mnist-like-rows-fed-for-training.png", "feed-startup.png"]
    for png in written:
        data = pathlib.Path(png).read_bytes()
        assert data.startswith(PNG) and len(data) > 10_000


def test_a_document_that_lost_a_field_or_whose_median_is_wrong_is_refused(tmp_path):
    record = Record("startup", {}, argv=[])
    record.add("seconds", "s", [1.0, 3.0], peer="duotf", backend="local", case="startup")
    doc = record.document()
    for broken, words in [({**doc, "schema": SCHEMA + 1}, "schema"),
                          ({k: v for k, v in doc.items() if k != "command"}, "no 'command'"),
                          ({**doc, "rows": [{**doc["rows"][0], "median": 1.0}]}, "median")]:
        path = tmp_path / "broken.json"
        path.write_text(json.dumps(broken))
        with pytest.raises(ValueError, match=words):
            load(str(path))
    with pytest.raises(ValueError, match="at least one value"):
        record.add("seconds", "s", [], peer="duotf")


def _documents():
    return sorted(DATA.glob("*.json"))


def test_every_committed_document_is_sound_and_drawn():
    documents = _documents()
    assert {p.stem for p in documents} >= {"feed", "scoring", "startup"}
    for path in documents:
        doc = load(str(path))  # the schema, every row's fields and median
        assert doc["command"].startswith(f"python -m benchmarks.{doc['benchmark']} ")
        assert "--json" in doc["argv"], f"{path.name}: not written by the benchmark's --json"
        for (chart, unit) in charts.comparisons(doc):
            png = IMAGES / charts.file_name(doc, chart, unit)
            assert png.is_file(), f"{path.name}: no {png.relative_to(ROOT)} (python -m benchmarks.charts)"


def test_every_chart_on_the_page_exists_beside_the_command_that_measured_it():
    page = PAGE.read_text()
    shown = re.findall(r"!\[[^\]]*\]\((img/benchmarks/[^)\s]+\.png)\)", page)
    assert shown, "docs/benchmarks.md shows no chart"
    drawn_by = {}
    for path in _documents():
        doc = load(str(path))
        for (chart, unit) in charts.comparisons(doc):
            drawn_by[charts.file_name(doc, chart, unit)] = doc
    for link in shown:
        assert (ROOT / "docs" / link).is_file(), f"docs/benchmarks.md shows {link}, which is missing"
        doc = drawn_by.get(pathlib.Path(link).name)
        assert doc, f"{link} is drawn from no document under docs/benchmarks/data/"
        assert doc["command"] in " ".join(page.split()), (  # a command may wrap across lines
            f"{link}: the page does not give its command {doc['command']!r}")
