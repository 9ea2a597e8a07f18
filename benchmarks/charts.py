"""The docs' benchmark charts, drawn from the JSON documents the benchmarks write (``--json``).

    python -m benchmarks.charts docs/benchmarks/data/*.json -o docs/img/benchmarks

One PNG for each comparison of each document (its rows of one ``chart`` and unit, see
``benchmarks/record.py``), named ``BENCHMARK-CHART.png``: a horizontal bar a row at its median,
each repeat's value a dot on it, a row marked ``reference`` (a limit, a goal) a dashed line
across, and under the chart the command that measured it and the machine it ran on. An axis
spans a log scale when its bars differ more than 30-fold (duotf beside TensorFlowOnSpark).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import textwrap
from typing import Any, Dict, List, Tuple

if not __package__:  # run as a script (python benchmarks/charts.py): benchmarks/ from its root
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.record import load  # noqa: E402

#: a bar's colour by whose figure it is; other peers take the next free colour
COLOURS = {"duotf": "#1f77b4", "TensorFlowOnSpark 2.2.5": "#d62728", "model.predict": "#7f7f7f",
           "TensorFlow": "#7f7f7f", "in-process limit": "#2ca02c"}
SPARE = ["#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22"]
#: the longest bar over the shortest past which the axis is logarithmic
LOG_RATIO = 50


def comparisons(doc: Dict[str, Any]) -> Dict[Tuple[str, str], List[Dict[str, Any]]]:
    """A document's rows by ``(chart, unit)``, in the order they were recorded."""
    groups: Dict[Tuple[str, str], List[Dict[str, Any]]] = {}
    for row in doc["rows"]:
        groups.setdefault((row["chart"], row["unit"]), []).append(row)
    return groups


def file_name(doc: Dict[str, Any], chart: str, unit: str) -> str:
    """The PNG's name: ``BENCHMARK-CHART.png`` (the unit added where one chart has two)."""
    units = {u for c, u in comparisons(doc) if c == chart}
    title = chart if len(units) == 1 else f"{chart} {unit}"
    slug = re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")[:48].rstrip("-")
    return f"{doc['benchmark']}-{slug}.png"


def caption(doc: Dict[str, Any]) -> str:
    """The lines under a chart: the command, the machine and the load it ran under."""
    info = doc["machine"]
    versions = info.get("versions", {})
    libs = ", ".join(f"{name} {versions[name]}" for name in
                     ("pyspark", "dask", "tensorflow-cpu", "tensorflow", "keras") if name in versions)
    load = info.get("load_average") or {}
    load_text = ""
    if load.get("start") and load.get("end"):
        load_text = f"; load average (1 min) {load['start'][0]:g} at the start, {load['end'][0]:g} at the end"
    when = doc["date"].replace("T", " ")[:16]
    lines = [f"$ {doc['command']}",
             f"{when} UTC, {doc.get('seconds', 0):.0f} s; {info['cpus']} CPUs, "
             f"{info['platform']}, Python {info['python']}; {libs}{load_text}"]
    return "\n".join(textwrap.fill(line, 120, subsequent_indent="    ") for line in lines)


def _label(row: Dict[str, Any]) -> str:
    """A bar's name: its label (or its backend and case), after its peer where that is a
    baseline the label does not name, else after its backend where the label does not name it."""
    text = row.get("label") or " ".join(x for x in (row["backend"], row["case"]) if x)
    if row["peer"] != "duotf" and not row.get("reference"):
        text = f"{row['peer']}: {text}" if row["peer"] not in text else text
    elif row["backend"] and row["backend"] not in text:
        text = f"{row['backend']}: {text}"
    return text


def _format(value: float, unit: str) -> str:
    if unit == "s":
        return f"{value:.3f} s" if value < 0.1 else f"{value:.2f} s"
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def draw(doc: Dict[str, Any], chart: str, unit: str, rows: List[Dict[str, Any]], path: str) -> None:
    """One comparison as a PNG at ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib import ticker

    bars = [r for r in rows if not r.get("reference")]
    lines = [r for r in rows if r.get("reference")]
    colours = dict(COLOURS)
    for row in rows:
        if row["peer"] not in colours:
            colours[row["peer"]] = SPARE[(len(colours) - len(COLOURS)) % len(SPARE)]

    text = caption(doc)
    below = 0.15 + 0.12 * (text.count("\n") + 1)  # inches for the caption
    height = 1.4 + 0.36 * len(bars) + below
    fig, ax = plt.subplots(figsize=(11, height), dpi=100)
    y = list(range(len(bars)))[::-1]  # the first row recorded on top
    ax.barh(y, [r["median"] for r in bars], color=[colours[r["peer"]] for r in bars], height=0.7)
    for yi, row in zip(y, bars):
        if len(row["values"]) > 1:
            ax.plot(row["values"], [yi] * len(row["values"]), "o", color="black", markersize=3,
                    alpha=0.7)
    medians = [r["median"] for r in bars if r["median"] > 0]
    if medians and max(medians) / min(medians) > LOG_RATIO:
        ax.set_xscale("log")
    top = max([v for r in rows for v in r["values"]] + [r["median"] for r in rows])
    ax.set_xlim(right=top * (4 if ax.get_xscale() == "log" else 1.22))
    for yi, row in zip(y, bars):  # the median, right of the bar and of its dots
        ax.annotate(_format(row["median"], unit), (max(row["values"] + [row["median"]]), yi),
                    xytext=(6, 0), textcoords="offset points", va="center", fontsize=8,
                    bbox={"facecolor": "white", "edgecolor": "none", "pad": 0.5, "alpha": 0.8})
    handles, labels = [], []
    peers = [p for p in colours if any(r["peer"] == p for r in bars)]
    if len(peers) > 1:  # whose bar is whose
        handles += [plt.Rectangle((0, 0), 1, 1, color=colours[p]) for p in peers]
        labels += peers
    for i, row in enumerate(lines):
        handles.append(ax.axvline(row["median"], color="black", linewidth=1,
                                  linestyle=("--", ":", "-.")[i % 3]))
        labels.append(f"{_label(row)} ({_format(row['median'], unit)})")
    if handles:
        ax.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8,
                  frameon=False)
    if ax.get_xscale() == "linear":  # 120,000 rather than 1.2e5 or digits run together
        ax.xaxis.set_major_locator(ticker.MaxNLocator(6))
        ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:,.0f}" if v >= 1e5 else f"{v:,g}"))
    ax.set_yticks(y)
    ax.set_yticklabels([_label(r) for r in bars], fontsize=8)
    metric = rows[0]["metric"]
    ax.set_xlabel(unit if metric == unit else f"{metric} ({unit})")
    ax.set_title(f"{doc['benchmark']}: {chart}", fontsize=10)
    ax.grid(axis="x", alpha=0.3)
    fig.text(0.01, 0.1 / height, text, fontsize=6.5, family="monospace", va="bottom")
    fig.tight_layout(rect=(0, below / height, 1, 1))
    fig.savefig(path)
    plt.close(fig)


def draw_all(paths: List[str], out: str) -> List[str]:
    """Every comparison of every document in ``paths`` as a PNG in ``out``; the files written."""
    os.makedirs(out, exist_ok=True)
    written = []
    for path in paths:
        doc = load(path)
        for (chart, unit), rows in comparisons(doc).items():
            target = os.path.join(out, file_name(doc, chart, unit))
            draw(doc, chart, unit, rows, target)
            written.append(target)
    return written


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description="draw the benchmarks' JSON documents as PNG charts")
    parser.add_argument("documents", nargs="+", help="JSON files written by a benchmark's --json")
    parser.add_argument("-o", "--out", default="docs/img/benchmarks", help="folder of the PNGs")
    opts = parser.parse_args(argv)
    for path in draw_all(opts.documents, opts.out):
        print(path)


if __name__ == "__main__":
    main()
