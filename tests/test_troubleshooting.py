"""docs/troubleshooting.md is keyed by the messages users see: each entry's message is made here
as a user meets it (no Java, another Python on the executors, no TensorFlow there, dynamic
allocation, too few slots, nodes that do not start, a driver address of another machine, a full
port range), and the page's text must be in what duotf or the engine printed. An entry whose
message comes from a cluster manager the tests do not run says so on the page and in
``NOT_MADE``.
"""

from __future__ import annotations

import os
import pathlib
import re
import socket
import subprocess
import sys
import textwrap
from typing import Callable, Dict, List, Tuple

import pytest

import duotf
from duotf.backends import LocalBackend

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "troubleshooting.md"

#: an entry's message -> why it is not made here
NOT_MADE = {
    "Container killed by YARN for exceeding memory limits":
        "YARN's message, in a NodeManager's log: no YARN cluster runs in the tests",
}

#: an entry's message -> (what makes it, as a user meets it; the page's other quotes of what
#: was printed, which must be in it too)
MADE: Dict[str, Tuple[Callable[[pathlib.Path], str], List[str]]] = {}


def makes(message: str, *quotes: str):
    def register(function):
        MADE[message] = (function, list(quotes))
        return function
    return register


def entries() -> Dict[str, str]:
    """The page's entries: message (the heading's) -> the entry's text."""
    text = PAGE.read_text()
    parts = re.split(r"^### `([^`]+)`\n", text, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2]))


def _run(argv, env=None, timeout=300) -> str:
    out = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout, cwd="/")
    return out.stdout + out.stderr


@makes("JAVA_HOME is not set", "[JAVA_GATEWAY_EXITED] Java gateway process exited before sending its port number",
       "no java: JAVA_HOME is not set and no java on PATH")
def _no_java(tmp: pathlib.Path) -> str:
    """A machine without Java: this one's PATH, less every ``java``, and no JAVA_HOME."""
    bin_dir = tmp / "bin"
    bin_dir.mkdir()
    for folder in os.environ["PATH"].split(os.pathsep):
        if not os.path.isdir(folder):
            continue
        for name in os.listdir(folder):
            if name != "java" and not (bin_dir / name).exists():
                (bin_dir / name).symlink_to(os.path.join(folder, name))
    env = {k: v for k, v in os.environ.items() if k != "JAVA_HOME"}
    env["PATH"] = str(bin_dir)
    session = _run([sys.executable, "-c", "from pyspark.sql import SparkSession\n"
                    "SparkSession.builder.master('local[1]').getOrCreate()"], env)
    doctor = _run([sys.executable, "-m", "duotf", "doctor", "--backend", "spark"], env)
    return session + doctor


def _other_python() -> str:
    """An interpreter of another minor version than this one, the nearest one (pyenv's, or a
    ``python3.N`` on PATH), or a skip."""
    import shutil

    mine = sys.version_info.minor
    pyenv = os.path.expanduser("~/.pyenv/versions")
    found = [os.path.join(pyenv, v, "bin", "python3") for v in os.listdir(pyenv)] \
        if os.path.isdir(pyenv) else []
    found += [shutil.which(f"python3.{n}") or "" for n in range(9, 16)]
    versions = {}
    for path in filter(os.path.exists, found):
        said = _run([path, "-c", "import sys; print(sys.version_info[1])"], timeout=30).strip()
        if said.isdigit() and int(said) >= 9 and int(said) != mine:
            versions.setdefault(int(said), path)
    if not versions:
        pytest.skip(f"no Python 3 other than 3.{mine} here to run Spark's workers with")
    return versions[min(versions, key=lambda n: abs(n - mine))]


_SPARK_SCRIPT = textwrap.dedent("""
    from pyspark.sql import SparkSession
    import duotf
    spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
             .config("spark.dynamicAllocation.enabled", "true").getOrCreate())
    def main(args, ctx):
        return ctx.node_id
    try:
        duotf.run(main, None, spark, duotf.ClusterSpec(workers=1))
    except Exception as exc:
        print(f"{type(exc).__name__}: {exc}")
    try:
        spark.sparkContext.parallelize([1, 2]).map(lambda x: x).collect()
    except Exception as exc:
        print(f"{type(exc).__name__}: {exc}")
    spark.stop()
""")


_spark_said: List[str] = []


def _spark_outputs(tmp: pathlib.Path) -> str:
    """A Spark session with dynamic allocation on, whose workers run another Python (one
    session for both entries: the same xdist group)."""
    if not _spark_said:
        env = dict(os.environ, PYSPARK_PYTHON=_other_python(), PYSPARK_DRIVER_PYTHON=sys.executable)
        _spark_said.append(_run([sys.executable, "-c", _SPARK_SCRIPT], env))
    return _spark_said[0]


makes("Python in worker has different version", "[PYTHON_VERSION_MISMATCH]",
      "PySpark cannot run with different minor versions")(_spark_outputs)
makes("barrier stage, which needs a fixed set of executors",
      "BackendError: duotf runs nodes as a barrier stage, which needs a fixed set of executors")(_spark_outputs)


@makes("No module named 'tensorflow'", "install one TensorFlow (")
def _no_tensorflow(tmp: pathlib.Path) -> str:
    """Nodes whose Python has no TensorFlow: their site-packages seen through a folder of links
    to every package but TensorFlow's (a ``sitecustomize`` puts it in its place)."""
    import site

    overlay, hook = tmp / "site-packages", tmp / "hook"
    overlay.mkdir()
    hook.mkdir()
    real = [p for p in site.getsitepackages() if os.path.isdir(os.path.join(p, "tensorflow"))]
    assert real, "no TensorFlow installed in a site-packages folder here"
    for name in os.listdir(real[0]):
        if not name.startswith("tensorflow"):
            (overlay / name).symlink_to(os.path.join(real[0], name))
    (hook / "sitecustomize.py").write_text(
        "import sys\n"
        f"sys.path[:] = [{str(overlay)!r} if p == {real[0]!r} else p for p in sys.path]\n")
    report = duotf.doctor("local", duotf.ClusterSpec(workers=1), env={"PYTHONPATH": str(hook)},
                          timeout=120)
    return str(report)


@makes("the cluster needs 3 nodes running at once but the")
def _too_few_slots(tmp: pathlib.Path) -> str:
    with pytest.raises(duotf.InsufficientSlotsError) as info:
        duotf.run(lambda args, ctx: None, None, LocalBackend(slots=2), duotf.ClusterSpec(workers=3))
    return f"InsufficientSlotsError: {info.value}"


@makes("within reservation_timeout", "ReservationTimeoutError: only")
def _nodes_that_do_not_start(tmp: pathlib.Path) -> str:
    """Node 1's process never gets to register (its interpreter hangs as it starts)."""
    (tmp / "sitecustomize.py").write_text(
        "import os, time\nif os.environ.get('DUOTF_NODE_ID') == '1':\n    time.sleep(60)\n")
    env = {"PYTHONPATH": str(tmp), "DUOTF_WARM_NODES": "0"}
    with pytest.raises(duotf.ReservationTimeoutError) as info:
        duotf.run(lambda args, ctx: None, None, "local", duotf.ClusterSpec(workers=2),
                  reservation_timeout=3, env=env)
    return f"ReservationTimeoutError: {info.value}"


@makes("it is not an address of", "ConfigError: the rendezvous server cannot listen on",
       "Cannot assign requested address; its addresses:")
def _a_driver_address_of_another_machine(tmp: pathlib.Path) -> str:
    address = "198.51.100.77"  # TEST-NET-2: no machine's
    with pytest.raises(duotf.ConfigError) as info:
        duotf.run(lambda args, ctx: None, None, "local", duotf.ClusterSpec(workers=1),
                  driver_host=address)
    report = duotf.doctor("local", duotf.ClusterSpec(workers=1), driver_host=address)
    assert report["driver port"].status == "FAIL"
    return f"ConfigError: {info.value}\n{report}"


@makes("no free port for", "PortRangeError: no free port for")
def _a_full_port_range(tmp: pathlib.Path) -> str:
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        with pytest.raises(duotf.PortRangeError) as info:
            duotf.run(lambda args, ctx: None, None, "local", duotf.ClusterSpec(workers=1),
                      ports=f"{port}-{port}")
    return f"PortRangeError: {info.value}"


def test_every_entry_is_made_here_or_says_why_not():
    found = entries()
    assert set(found) == set(MADE) | set(NOT_MADE), "an entry without a maker, or a maker without an entry"
    for message in NOT_MADE:
        assert "not checked" in found[message]  # the page says so too


@pytest.mark.parametrize("message", [
    pytest.param(m, marks=[pytest.mark.xdist_group("troubleshooting-spark")]
                 if MADE[m][0] is _spark_outputs else []) for m in sorted(MADE)])
def test_the_entry_quotes_what_the_user_sees(message, tmp_path):
    make, quotes = MADE[message]
    entry = entries()[message]
    for quote in quotes:  # the page quotes it, and it was printed
        assert quote.split(" (")[0] in " ".join(entry.split()), f"the entry does not quote {quote!r}"
    printed = make(tmp_path)
    for said in [message] + quotes:
        assert said in printed, f"{said!r} is not in what was printed:\n{printed[-3000:]}"
