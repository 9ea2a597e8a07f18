"""Quiet by default, useful when asked (issue 13, point 7): the engines' known notices, the
nodes' TensorFlow C++ INFO notes and duotf's own log records, off and on."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import warnings

import pytest

import duotf
import duotf._verbosity as verbosity

PANDAS_NOTICE = ("PySpark does not yet fully support pandas >= 3.0.0. Some features may not work "
                 "correctly. It is recommended to use pandas < 3.0.0 for now.")


def _filters_for(text: str) -> int:
    return sum(1 for entry in warnings.filters
               if entry[0] == "ignore" and entry[1] is not None and entry[1].match(text))


def test_the_pandas_notice_is_filtered_once_and_shown_when_verbose():
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        verbosity.quiet_known_notices()
        verbosity.quiet_known_notices()
        assert _filters_for(PANDAS_NOTICE) == 1
        warnings.warn(PANDAS_NOTICE, FutureWarning)
        warnings.warn("another FutureWarning", FutureWarning)  # only the known notice goes
        assert [str(w.message) for w in seen] == ["another FutureWarning"]
        try:
            duotf.set_verbose(True)
            assert _filters_for(PANDAS_NOTICE) == 0
            warnings.warn(PANDAS_NOTICE, FutureWarning)
            assert [str(w.message) for w in seen][-1] == PANDAS_NOTICE
        finally:
            duotf.set_verbose(False)
        assert _filters_for(PANDAS_NOTICE) == 1 and not verbosity.is_verbose()


def test_importing_duotf_changes_no_warnings_filter():
    # a library leaves the process's warnings filters to its user: duotf filters pyspark's
    # pandas notice only once one of its Spark functions or engines is used (not verbose)
    code = textwrap.dedent("""
        import numpy, pandas, pyarrow  # their own filters, made as they are imported
        import warnings
        before = list(warnings.filters)
        import duotf, duotf.spark, duotf.dask, duotf.io, duotf.keras, duotf.backends
        print([entry for entry in warnings.filters if entry not in before])
    """)
    root = os.path.dirname(os.path.dirname(os.path.abspath(duotf.__file__)))
    env = {**os.environ, "PYTHONPATH": root}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", done.stdout


SCRIPT = textwrap.dedent("""
    import os
    import duotf

    def main(args, ctx):
        print("hello from the node")
        return os.environ.get("TF_CPP_MIN_LOG_LEVEL")

    if __name__ == "__main__":
        with duotf.run(main, None, "local", duotf.ClusterSpec(workers=1), verbose={verbose}) as c:
            print("RESULT", c.wait(timeout=60))
""")


def _script(tmp_path, verbose: bool):
    path = tmp_path / f"verbose_{verbose}.py"
    path.write_text(SCRIPT.format(verbose=verbose))
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    root = os.path.dirname(os.path.dirname(os.path.abspath(duotf.__file__)))
    env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in [env.get("PYTHONPATH")] if p])
    return subprocess.run([sys.executable, str(path)], capture_output=True, text=True, env=env,
                          timeout=120, cwd=tmp_path)


def test_a_script_that_imports_ipykernel_shows_no_bars():
    # pyspark imports ipykernel in any script where it is installed: that is no notebook
    import subprocess
    import sys

    pytest.importorskip("ipykernel")
    code = "import ipykernel; from duotf._driver.progress import _interactive; print(_interactive())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False"], out


def test_a_script_is_quiet_by_default_and_shows_everything_when_verbose(tmp_path):
    """A plain script (no logging configured): by default nothing of duotf's own on stderr, the
    node's own line only (issue 32: shown, prefixed), and the nodes' TF INFO notes hidden;
    ``verbose=True``: the lifecycle too, and the nodes told to show TF's INFO notes."""
    quiet = _script(tmp_path, False)
    assert quiet.returncode == 0, quiet.stderr
    assert quiet.stdout.splitlines() == ["RESULT ['1']"]
    assert "duotf" not in quiet.stderr
    assert quiet.stderr.splitlines() == ["[worker:0] hello from the node"]

    loud = _script(tmp_path, True)
    assert loud.returncode == 0, loud.stderr
    assert loud.stdout.splitlines() == ["RESULT ['0']"]
    lines = loud.stderr.splitlines()
    assert any(line.startswith("duotf: starting 1 nodes on local") for line in lines), lines
    assert "[worker:0] hello from the node" in lines, lines
    assert any(line.startswith("duotf: cluster") and "shut down" in line for line in lines), lines


# -- a script's view: the nodes' own output shown, duotf's and the libraries' noise not --------

NODES_SCRIPT = textwrap.dedent("""
    import logging, sys
    import duotf

    def main(args, ctx):
        print("hello from", ctx.node_id)
        return ctx.node_id

    if __name__ == "__main__":
        engine, log_to_driver, configured = sys.argv[1], sys.argv[2] == "1", sys.argv[3] == "1"
        if configured:
            logging.basicConfig(level=logging.INFO, format="USER %(message)s")
        with duotf.run(main, None, engine, duotf.ClusterSpec(workers=2),
                       log_to_driver=log_to_driver) as c:
            print("RESULT", c.wait(timeout=120))
""")


def _driver(tmp_path, script: str, *argv, env=None):
    """Run ``script`` as a plain ``python`` driver; its CompletedProcess (text)."""
    path = tmp_path / "driver.py"
    path.write_text(script)
    full = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    root = os.path.dirname(os.path.dirname(os.path.abspath(duotf.__file__)))
    full["PYTHONPATH"] = os.pathsep.join([root] + [p for p in [full.get("PYTHONPATH")] if p])
    full.update(env or {})
    done = subprocess.run([sys.executable, str(path), *map(str, argv)], capture_output=True,
                          text=True, env=full, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    return done


@pytest.mark.parametrize("engine", ["local", "dask"])
def test_a_scripts_nodes_print_on_its_stderr_prefixed(tmp_path, engine):
    """Issue 32, item 11: what main prints reaches the driver's stderr, prefixed by node, with no
    logging configured (as Ray Train and TorchDistributor show it); duotf's lifecycle stays
    quiet; log_to_driver=False shows nothing."""
    shown = _driver(tmp_path, NODES_SCRIPT, engine, 1, 0)
    assert shown.stdout.splitlines() == ["RESULT [0, 1]"]
    lines = shown.stderr.splitlines()
    assert "[worker:0] hello from 0" in lines and "[worker:1] hello from 1" in lines, lines
    assert not [line for line in lines if line.startswith("duotf:")], lines

    # nothing relayed: the lines stay where the engine task's output goes (for these engines'
    # task processes, started by the driver, its stdout, unprefixed)
    hidden = _driver(tmp_path, NODES_SCRIPT, engine, 0, 0)
    assert "RESULT [0, 1]" in hidden.stdout.splitlines()
    assert "[worker:" not in hidden.stderr + hidden.stdout


def test_a_scripts_own_logging_shows_the_nodes_lines_once(tmp_path):
    """With a handler of the user's (here the root's), the lines go through it only."""
    done = _driver(tmp_path, NODES_SCRIPT, "local", 1, 1)
    lines = done.stderr.splitlines()
    assert lines.count("USER [worker:0] hello from 0") == 1, lines
    assert not [line for line in lines if line.startswith("[worker:")], lines


FIT_SCRIPT = textwrap.dedent("""
    import sys
    import duotf

    def fit_main(args, ctx):
        import tensorflow as tf
        print("fitting on", ctx.node_id)
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
        ds = ctx.get_data_feed(train=True).dataset(16, features="x", label="y")
        with strategy.scope():
            model = tf.keras.Sequential([tf.keras.Input(()), tf.keras.layers.Reshape((1,)),
                                         tf.keras.layers.Dense(1)])
            model.compile(tf.keras.optimizers.SGD(0.001), "mse")
        return len(model.fit(ds, epochs=2, verbose=0).history["loss"])

    def data(engine):
        import pandas as pd
        frame = pd.DataFrame({"x": [float(i) for i in range(101)],
                              "y": [float(i) for i in range(101)]})  # 101 rows: 1 left over
        if engine == "local":
            return [frame[:51], frame[51:]]
        if engine == "dask":
            import dask.dataframe as dd
            return dd.from_pandas(frame, npartitions=2)
        from pyspark.sql import SparkSession
        return SparkSession.getActiveSession().createDataFrame(frame).repartition(2)

    if __name__ == "__main__":
        engine, verbose = sys.argv[1], sys.argv[2] == "1"
        with duotf.run(fit_main, None, engine, duotf.ClusterSpec(workers=2),
                       verbose=verbose) as c:
            c.train(data(engine), epochs=2)
            print("RESULT", c.wait(timeout=240))
""")

#: what a Keras fit on the feed made every script show before issue 32 (item 4)
NOISE = ["All log messages before absl::InitializeLog() is called",
         "oneDNN custom operations are on",
         "`shuffle=True` was passed, but will be ignored",
         "Your input ran out of data; interrupting training",
         "1 rows left over after giving each of 2 workers 50 rows are not fed"]


def _emitted(text: str) -> bool:
    """Whether this Keras says ``text`` at all: Keras 3.11 has the shuffle warning commented
    out in ``keras/src/trainers/data_adapters``; 3.15 says it."""
    if not text.startswith("`shuffle=True`"):
        return True
    import importlib.util

    spec = importlib.util.find_spec("keras.src.trainers.data_adapters")
    with open(spec.origin, encoding="utf-8") as f:
        return any(text in line and not line.lstrip().startswith("#") for line in f)


# a driver script each, run twice (quiet, verbose), with a Keras fit: the fast tier runs the
# in-process backend's, the full tier each engine's (Spark adds its console progress bar)
@pytest.mark.parametrize("engine", ["local", pytest.param("dask", marks=pytest.mark.slow),
                                    pytest.param("spark", marks=pytest.mark.slow)])
def test_a_keras_fit_on_the_feed_is_quiet_unless_verbose(tmp_path, engine):
    """Issue 32, item 4: TensorFlow's start-up notes, Keras's warnings about the feed's dataset,
    the balanced plan's left-over rows and Spark's console progress bar are hidden by default;
    ``verbose=True`` shows them. The nodes' own lines show either way."""
    # this machine's cores are the two nodes' slots: local[3] leaves one for the feed. TF turns
    # oneDNN on (and says so) by itself only on some CPUs (not on an AMD EPYC with AVX2 alone);
    # asked to, it does on any x86 CPU, so that its note is there to hide or show on every machine
    env = {"PYSPARK_SUBMIT_ARGS": "--master local[3] pyspark-shell", "TF_ENABLE_ONEDNN_OPTS": "1"}
    quiet = _driver(tmp_path, FIT_SCRIPT, engine, 0, env=env)
    assert quiet.stdout.splitlines() == ["RESULT [2, 2]"]
    assert "[worker:1] fitting on 1" in quiet.stderr.splitlines()
    assert [text for text in NOISE + ["[Stage "] if text in quiet.stderr] == [], quiet.stderr
    # nor Spark's warning that an RDD checkpointed locally was unpersisted: duotf's own, which
    # keeps the frames the later epochs are fed from, released once they are deleted
    assert "was locally checkpointed" not in quiet.stderr, quiet.stderr
    # nor a stack trace, Java's or Python's (issue 48: the JVM helpers of another Spark line)
    assert [text for text in ("Exception in thread", "Traceback", "py4j") if text in quiet.stderr] == [], \
        quiet.stderr

    loud = _driver(tmp_path, FIT_SCRIPT, engine, 1, env=env)
    assert loud.stdout.splitlines() == ["RESULT [2, 2]"]
    assert "[worker:1] fitting on 1" in loud.stderr.splitlines()
    assert [text for text in NOISE if text not in loud.stderr and _emitted(text)] == [], loud.stderr
    if engine == "spark":  # the session duotf made: Spark's default for a pyspark driver
        assert "[Stage " in loud.stderr
    assert "was locally checkpointed" not in loud.stderr, loud.stderr  # gone, not hidden


SCORE_SCRIPT = textwrap.dedent("""
    import sys
    from pyspark.sql import SparkSession
    import duotf.spark

    spark = SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    df = spark.createDataFrame([(float(i),) for i in range(8)], "x double").repartition(2)
    scored = duotf.spark.predict(df, sys.argv[1], columns=["x"]).collect()
    print("RESULT", len(scored))
    spark.stop()
""")


@pytest.mark.slow
def test_scoring_on_spark_shows_none_of_tensorflows_start_up_notes(tmp_path):
    # duotf imports TensorFlow to score, in the driver and in Spark's Python workers, whose
    # stderr is the user's terminal on local[N]: what it hides in a node, it hides there
    import keras

    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
    model.save(tmp_path / "m.keras")
    env = {"TF_ENABLE_ONEDNN_OPTS": "1", "PYSPARK_PYTHON": sys.executable}  # its note on any x86 CPU
    quiet = _driver(tmp_path, SCORE_SCRIPT, tmp_path / "m.keras", env=env)
    assert quiet.stdout.splitlines() == ["RESULT 8"]
    assert [text for text in NOISE[:2] + ["This TensorFlow binary is optimized"]
            if text in quiet.stderr] == [], quiet.stderr
    loud = _driver(tmp_path, SCORE_SCRIPT, tmp_path / "m.keras", env=dict(env, TF_CPP_MIN_LOG_LEVEL="0"))
    assert "oneDNN custom operations are on" in loud.stderr  # asked for, shown


def test_a_quiet_import_of_tensorflow_keeps_every_other_line():
    code = textwrap.dedent("""
        import os, sys, threading
        from duotf._node.output import import_tensorflow_quietly

        sys.meta_path.insert(0, type("Say", (), {"find_spec": staticmethod(
            lambda name, *a: os.write(2, b"mine: " + name.encode() + b"\\n") and None
            if name == "tensorflow" else None)}))
        import_tensorflow_quietly()
        print("level set after:", "TF_CPP_MIN_LOG_LEVEL" in os.environ, file=sys.stderr)
    """)
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=dict(env, TF_ENABLE_ONEDNN_OPTS="1"), timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines() == ["mine: tensorflow", "level set after: False"], done.stderr
