"""Where the suite's time goes: ``python3 -m pytest --timings=DIR`` records it, and
``python3 -m tests.timings DIR`` prints the tables of docs/contributing.md from the record.

While the option is on, the plugin writes one JSON line a test into ``DIR/tests.jsonl``: its
engine, module, phases, the fixtures it set up (engines among them), the intervals its own
thread slept (fixed waits and polls) and, on a classic Spark session, the intervals of the Spark
jobs that ran during it. Every Python process the suite starts (node processes, Spark's Python
workers, Dask workers) loads ``tests/timings_site/sitecustomize.py``, which writes when it
started, when it imported TensorFlow and when it ended into ``DIR/procs-<pid>.jsonl``.

The report splits each test's wall time into causes, each second counted once, in this order:
engine start (setting up the fixtures that start engines), TensorFlow imported by a node process,
a warm node server importing TensorFlow (duotf._node.warm), a node process starting before its
own import, a Spark job running, the test's own thread sleeping
(a fixed wait or a poll between its checks), a node process running (its ``main``: TF work and
feeding) and the rest (the test process's own work, teardown, leak checks).
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import sys
import threading
import time
from typing import Dict, Iterable, List, Optional, Tuple

import pytest

SITE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "timings_site")
#: the fixtures that start engines, clusters and servers (one a session, or a module)
ENGINE_FIXTURES = ("backend", "spark_standalone_master", "spark_connect_server",
                   "spark_hosts_master", "dask_hosts_scheduler", "spark", "spark_gpu_master",
                   "scoring_models")

Interval = Tuple[float, float]


def pytest_addoption(parser):
    parser.addoption("--timings", metavar="DIR", default=None,
                     help="record where each test's time goes into DIR (python3 -m tests.timings "
                          "DIR prints the tables)")


class _Recorder:
    def __init__(self, folder: str):
        self.folder = folder
        self.out = open(os.path.join(folder, "tests.jsonl"), "a")
        self.current: Optional[dict] = None
        self.spark_jobs_seen = -1
        self.main_thread = threading.main_thread()
        self._sleep = time.sleep

    def install(self) -> None:
        os.environ["DUOTF_TIMINGS_DIR"] = self.folder
        path = os.environ.get("PYTHONPATH")
        os.environ["PYTHONPATH"] = SITE + (os.pathsep + path if path else "")
        # a node's agent gives it this process's sys.path as its PYTHONPATH
        sys.path.append(SITE)
        sleep = self._sleep

        def timed_sleep(seconds):
            if self.current is None or threading.current_thread() is not self.main_thread:
                return sleep(seconds)
            begun = time.time()
            try:
                return sleep(seconds)
            finally:
                self.current["sleeps"].append((begun, time.time()))

        time.sleep = timed_sleep

    def spark_jobs(self) -> List[Interval]:
        """The Spark jobs of the active classic session that ended since the last call."""
        try:
            from pyspark import SparkContext
        except ImportError:
            return []
        sc = SparkContext._active_spark_context
        if sc is None:
            return []
        found = []
        try:
            jobs = sc._jsc.sc().statusStore().jobsList(None)
            # newest first: read back to the last one seen (each is a py4j call; the whole
            # list, read at every test, cost a fifth of a second a test)
            newest = self.spark_jobs_seen
            for i in range(jobs.size()):
                job = jobs.apply(i)
                if job.jobId() <= self.spark_jobs_seen:
                    break
                if not job.completionTime().isDefined():
                    continue
                newest = max(newest, job.jobId())
                submitted = job.submissionTime()
                if submitted.isDefined():
                    found.append((submitted.get().getTime() / 1000,
                                  job.completionTime().get().getTime() / 1000))
            self.spark_jobs_seen = newest
        except Exception:  # a stopped session: nothing to read
            return []
        return found


_recorder: Optional[_Recorder] = None


def pytest_configure(config):
    global _recorder
    _is_worker[0] = hasattr(config, "workerinput")
    folder = config.getoption("--timings")
    if folder and not hasattr(config, "workerinput"):
        os.makedirs(folder, exist_ok=True)
        _recorder = _Recorder(os.path.abspath(folder))
        _recorder.install()
    elif folder:  # an xdist worker: the controller set the environment before it started
        os.makedirs(folder, exist_ok=True)
        _recorder = _Recorder(os.path.abspath(folder))
        _recorder.install()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if _recorder is None:
        yield
        return
    params = getattr(getattr(item, "callspec", None), "params", {})
    _recorder.spark_jobs()  # what ran before this test is not its own
    _recorder.current = {"nodeid": item.nodeid, "module": item.nodeid.split("::")[0],
                         "engine": params.get("backend", "-"), "start": time.time(),
                         "phases": {}, "fixtures": [], "sleeps": [], "outcome": "passed",
                         "worker": os.environ.get("PYTEST_XDIST_WORKER", "-")}
    try:
        yield
    finally:
        record, _recorder.current = _recorder.current, None
        record["end"] = time.time()
        record["spark_jobs"] = _recorder.spark_jobs()
        _recorder.out.write(json.dumps(record) + "\n")
        _recorder.out.flush()


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef, request):
    begun = time.time()
    yield
    if _recorder is not None and _recorder.current is not None and fixturedef.scope != "function":
        _recorder.current["fixtures"].append((fixturedef.argname, begun, time.time()))


def pytest_runtest_logreport(report):
    _count_by_engine(report)
    if _recorder is not None and _recorder.current is not None:
        _recorder.current["phases"][report.when] = report.duration
        if report.failed:
            _recorder.current["outcome"] = "failed"
        elif report.skipped and report.when != "teardown":
            _recorder.current["outcome"] = "skipped"


# -- what every run prints at its end: the time of each engine, and of the tier ------------------
_by_engine: Dict[str, list] = collections.defaultdict(lambda: [0, 0.0])
_session_start = [time.time()]


def pytest_sessionstart(session):
    _session_start[0] = time.time()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    engine = getattr(getattr(item, "callspec", None), "params", {}).get("backend", "(no engine)")
    report.user_properties.append(("engine", engine))  # an xdist worker sends it with the report


def _count_by_engine(report) -> None:
    """Counted where the reports end up: in the controller of an xdist run, else here."""
    if _is_worker[0]:
        return
    engine = dict(report.user_properties).get("engine", "(no engine)")
    counts = _by_engine[engine]
    counts[1] += report.duration
    if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
        counts[0] += 1


_is_worker = [False]


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if not _by_engine:
        return
    tier = config.getoption("tier", default="all") or "fast"
    workers = getattr(config.option, "numprocesses", None) or 0
    write = terminalreporter.write_line
    terminalreporter.section(f"time by engine (tier {tier})", sep="-")
    for engine, (tests, seconds) in sorted(_by_engine.items(), key=lambda kv: -kv[1][1]):
        write(f"{engine:>18}: {tests:5d} tests {seconds:8.1f} s")
    write(f"{'tier ' + tier:>18}: {sum(c[0] for c in _by_engine.values()):5d} tests "
          f"{time.time() - _session_start[0]:8.1f} s of wall time"
          + (f", {workers} workers (the engines' seconds add up theirs)" if workers else ""))


# -- the report -----------------------------------------------------------------------------------
def _merge(intervals: Iterable[Interval]) -> List[Interval]:
    merged: List[list] = []
    for a, b in sorted(i for i in intervals if i[1] > i[0]):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return [(a, b) for a, b in merged]


def _clip(intervals: List[Interval], window: Interval) -> List[Interval]:
    lo, hi = window
    return [(max(a, lo), min(b, hi)) for a, b in intervals if b > lo and a < hi]


def _minus(intervals: List[Interval], taken: List[Interval]) -> List[Interval]:
    """``intervals`` less what ``taken`` covers (both merged)."""
    out = []
    for a, b in intervals:
        for c, d in taken:
            if d <= a or c >= b:
                continue
            if c > a:
                out.append((a, c))
            a = max(a, d)
            if a >= b:
                break
        if a < b:
            out.append((a, b))
    return out


def _length(intervals: List[Interval]) -> float:
    return sum(b - a for a, b in intervals)


CAUSES = ("engine start", "node: import tensorflow", "warm node server: import tensorflow",
          "node: process start", "Spark jobs",
          "waits in the test (sleeps, polls)", "node: main running", "test process (the rest)")


def _procs(folder: str) -> List[dict]:
    last: Dict[tuple, dict] = {}
    for path in glob.glob(os.path.join(folder, "procs-*.jsonl")):
        with open(path) as f:
            for line in f:
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                key = (rec["pid"], rec["start"])
                if key not in last or rec["end"] > last[key]["end"]:
                    last[key] = rec
    return list(last.values())


def causes_of(test: dict, procs: List[dict]) -> Dict[str, float]:
    window = (test["start"], test["end"])
    nodes = [p for p in procs if p["kind"] == "node" and p["end"] > window[0] and p["start"] < window[1]]
    servers = [p for p in procs if p["kind"] == "warm" and p["tf"]]
    engine = [(a, b) for name, a, b in test["fixtures"] if name in ENGINE_FIXTURES]
    layers = [
        engine,
        [tuple(p["tf"]) for p in nodes if p["tf"]],
        [tuple(p["tf"]) for p in servers],
        [(p["start"], p["tf"][0] if p["tf"] else p["end"]) for p in nodes],
        [tuple(j) for j in test.get("spark_jobs", [])],
        [tuple(s) for s in test["sleeps"]],
        [(p["start"], p["end"]) for p in nodes],
    ]
    # a node that never imported TF: its start is up to its first second, the rest is its main
    layers[3] = [(a, min(b, a + 1.0)) if not p["tf"] else (a, b) for (a, b), p in zip(layers[3], nodes)]
    taken: List[Interval] = []
    out = {}
    for cause, intervals in zip(CAUSES, layers):
        mine = _minus(_clip(_merge(intervals), window), taken)
        out[cause] = _length(mine)
        taken = _merge(taken + mine)
    out[CAUSES[-1]] = max(0.0, (window[1] - window[0]) - _length(taken))
    return out


def _table(title: str, header: List[str], rows: List[list]) -> str:
    lines = [f"\n{title}\n", "| " + " | ".join(header) + " |",
             "| " + " | ".join(["---"] + ["---:"] * (len(header) - 1)) + " |"]
    for row in rows:
        lines.append("| " + " | ".join(str(c) for c in row) + " |")
    return "\n".join(lines)


def report(folder: str, top: int = 15) -> str:
    tests = []
    with open(os.path.join(folder, "tests.jsonl")) as f:
        for line in f:
            tests.append(json.loads(line))
    procs = _procs(folder)
    total = sum(t["end"] - t["start"] for t in tests)
    by_engine: Dict[str, list] = collections.defaultdict(lambda: [0, 0.0, 0.0])
    by_module: Dict[str, list] = collections.defaultdict(lambda: [0, 0.0])
    by_cause: Dict[str, float] = collections.Counter()
    slow = []
    for t in tests:
        seconds = t["end"] - t["start"]
        causes = causes_of(t, procs)
        e = by_engine[t["engine"]]
        e[0] += 1
        e[1] += seconds
        e[2] += causes["engine start"]
        m = by_module[t["module"]]
        m[0] += 1
        m[1] += seconds
        for k, v in causes.items():
            by_cause[k] += v
        slow.append((seconds, t["nodeid"]))
    out = [f"{len(tests)} tests, {total:.0f} s of test time ({total / 60:.1f} min)"]
    out.append(_table("By engine", ["engine", "tests", "seconds", "of which engine start"],
                      [[k, v[0], f"{v[1]:.0f}", f"{v[2]:.0f}"]
                       for k, v in sorted(by_engine.items(), key=lambda kv: -kv[1][1])]))
    out.append(_table(f"By module (the {top} slowest)", ["module", "tests", "seconds"],
                      [[k, v[0], f"{v[1]:.0f}"]
                       for k, v in sorted(by_module.items(), key=lambda kv: -kv[1][1])[:top]]))
    out.append(_table("By cause", ["cause", "seconds", "share"],
                      [[k, f"{by_cause[k]:.0f}", f"{100 * by_cause[k] / max(total, 1e-9):.0f} %"]
                       for k in CAUSES]))
    nodes = [p for p in procs if p["kind"] == "node"]
    imported = [p["tf"][1] - p["tf"][0] for p in nodes if p["tf"]]
    if nodes:
        out.append(f"\n{len(nodes)} node processes; {len(imported)} imported TensorFlow, "
                   f"{sorted(imported)[len(imported) // 2] if imported else 0:.1f} s each (median)")
    out.append(_table(f"The {top} slowest tests", ["test", "seconds"],
                      [[n, f"{s:.1f}"] for s, n in sorted(slow, reverse=True)[:top]]))
    return "\n".join(out)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder")
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args()
    print(report(args.folder, args.top))
    sys.exit(0)
