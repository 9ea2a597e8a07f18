"""What a benchmark measured, as one JSON document: its command, the machine, its settings and
its rows. ``benchmarks/charts.py`` draws the docs' charts from these documents.

A benchmark that takes ``--json PATH`` makes a :class:`Record` when it starts, adds a row for
every figure it prints in its summary (its own and each baseline's, measured in the same run)
and writes the document at the end; its printed output stays as it was::

    record = Record("feed", settings=vars(opts))
    record.add("rows/s", "rows/s", [rate], peer="duotf", backend="spark", case="mnist",
               chart="MNIST-like rows")
    record.write(opts.json)

The document (``SCHEMA`` = 1)::

    {"schema": 1, "benchmark": "feed",
     "command": "python -m benchmarks.feed --rows 50000 ...", "argv": [...],
     "date": "2026-11-24T10:02:11+00:00", "seconds": 512.3,
     "machine": {"cpus": 2, "platform": ..., "python": ..., "versions": {...},
                 "load_average": {"start": [...], "end": [...]}, ...},
     "settings": {...},
     "rows": [{"peer": "duotf", "backend": "spark", "case": "mnist", "chart": ...,
               "metric": "rows/s", "unit": "rows/s", "values": [...], "median": ...}, ...]}

``values`` are the raw figures, one a repeat (a benchmark that measures once has one), and
``median`` their median. ``chart`` names the comparison a row belongs to: the rows of one
chart and unit are drawn together.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional, Sequence

#: the version of the document's layout, raised when a field changes meaning
SCHEMA = 1
#: the fields every row has
ROW_FIELDS = ("peer", "backend", "case", "chart", "metric", "unit", "values", "median")
#: the checkout's root, the folder above benchmarks/
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: the libraries whose versions a document names (those installed)
LIBRARIES = ("duotf", "numpy", "pyarrow", "pandas", "pyspark", "dask", "distributed",
             "tensorflow", "tensorflow-cpu", "keras")


def command_line(module: str, argv: Optional[Sequence[str]] = None) -> str:
    """The command as a reader types it from a checkout: ``python -m MODULE ARGS``."""
    args = list(sys.argv[1:] if argv is None else argv)
    return shlex.join(["python", "-m", module] + args)


def _versions() -> Dict[str, str]:
    from importlib import metadata

    found = {}
    for name in LIBRARIES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return found


def _git(*args: str) -> Optional[str]:
    try:
        out = subprocess.run(["git", "-C", _ROOT, *args], capture_output=True, text=True,
                             timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def machine() -> Dict[str, Any]:
    """The machine: CPUs, memory, OS, Python and the versions of the libraries measured."""
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        usable = os.cpu_count()
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        memory = None
    commit = _git("rev-parse", "HEAD")
    modified = _git("status", "--porcelain", "--untracked-files=no")
    return {
        "cpus": os.cpu_count(),
        "cpus_usable": usable,
        "memory_bytes": memory,
        "platform": platform.platform(),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "versions": _versions(),
        # the checkout's commit, and whether files differed from it (None outside git)
        "commit": commit,
        "commit_modified": None if commit is None else bool(modified),
    }


def _load() -> Optional[List[float]]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


class Record:
    """The rows of one benchmark run, written as one JSON document by :meth:`write`.

    Parameters
    ----------
    benchmark : str
        The benchmark's name: its module under ``benchmarks/`` (``"feed"``).
    settings : dict
        The settings the run used (its parsed options, and what it chose itself); values that
        JSON cannot hold are written as their ``str``.
    argv : sequence of str, optional
        The command's arguments; ``sys.argv[1:]`` by default.
    """

    def __init__(self, benchmark: str, settings: Dict[str, Any],
                 argv: Optional[Sequence[str]] = None):
        self.benchmark = benchmark
        self.settings = dict(settings)
        # sys.argv, its program named from the checkout's root (not this machine's path to it)
        program = os.path.relpath(os.path.abspath(sys.argv[0]), _ROOT) if sys.argv[0] else ""
        self.argv = [program] + list(sys.argv[1:] if argv is None else argv)
        self.rows: List[Dict[str, Any]] = []
        self.started = time.time()
        self.date = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        self.load_at_start = _load()
        self.machine = machine()  # the checkout's state when the run started

    def add(self, metric: str, unit: str, values: Sequence[float], *, peer: str,
            backend: Optional[str] = None, case: Optional[str] = None,
            chart: Optional[str] = None, **extra: Any) -> Dict[str, Any]:
        """Add a measured row and return it.

        Parameters
        ----------
        metric, unit : str
            What was measured (``"feed rate"``) and its unit (``"rows/s"``, ``"s"``).
        values : sequence of float
            The raw figures, one a repeat; their median is computed here.
        peer : str
            Whose figure it is: ``"duotf"`` or a baseline measured in the same run
            (``"TensorFlowOnSpark 2.2.5"``, ``"in-process limit"``).
        backend, case : str, optional
            The engine (``"spark"``, ``"dask"``) and what was fed or run on it.
        chart : str, optional
            The comparison the row belongs to (its chart's title); the metric by default.
        extra
            Further figures of the row (JSON values), kept as they are.
        """
        values = [float(v) for v in values]
        if not values:
            raise ValueError(f"a row needs at least one value ({peer} {backend} {case} {metric})")
        row = {"peer": peer, "backend": backend, "case": case, "chart": chart or metric,
               "metric": metric, "unit": unit, "values": values,
               "median": statistics.median(values)}
        row.update(extra)
        self.rows.append(row)
        return row

    def document(self) -> Dict[str, Any]:
        """The JSON document (a dict) of what was recorded so far."""
        info = dict(self.machine)
        info["load_average"] = {"start": self.load_at_start, "end": _load()}
        return {
            "schema": SCHEMA,
            "benchmark": self.benchmark,
            "command": command_line(f"benchmarks.{self.benchmark}", self.argv[1:]),
            "argv": self.argv,
            "date": self.date,
            "seconds": round(time.time() - self.started, 1),
            "machine": info,
            "settings": json.loads(json.dumps(self.settings, default=str)),
            "rows": self.rows,
        }

    def write(self, path: str) -> None:
        """Write the document to ``path`` (its folder made if missing)."""
        folder = os.path.dirname(os.path.abspath(path))
        os.makedirs(folder, exist_ok=True)
        with open(path, "w") as f:
            json.dump(self.document(), f, indent=1)
            f.write("\n")
        print(f"wrote {path} ({len(self.rows)} rows)", flush=True)


def load(path: str) -> Dict[str, Any]:
    """A document written by :meth:`Record.write`, checked against the schema: a ``ValueError``
    names what is missing or wrong."""
    with open(path) as f:
        doc = json.load(f)
    if doc.get("schema") != SCHEMA:
        raise ValueError(f"{path}: schema {doc.get('schema')!r}, expected {SCHEMA}")
    for key in ("benchmark", "command", "argv", "date", "machine", "settings", "rows"):
        if key not in doc:
            raise ValueError(f"{path}: no {key!r}")
    for key in ("cpus", "platform", "python", "versions"):
        if key not in doc["machine"]:
            raise ValueError(f"{path}: machine has no {key!r}")
    if not doc["rows"]:
        raise ValueError(f"{path}: no rows")
    for i, row in enumerate(doc["rows"]):
        missing = [k for k in ROW_FIELDS if k not in row]
        if missing:
            raise ValueError(f"{path}: row {i} has no {', '.join(missing)}")
        if not row["values"] or row["median"] != statistics.median(row["values"]):
            raise ValueError(f"{path}: row {i}'s median is not that of its values")
    return doc
