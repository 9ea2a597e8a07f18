"""The README and the docs run as written: every ```python and ```bash block of README.md and
docs/**/*.md is run here, or listed in ``NOT_RUN`` with the reason it cannot be.

A block runs as a user copies it: with the python blocks of its page before it
(:func:`page_code`), where the page's setup block makes the session and data, and with no name
given (``run_block(..., as_written=True)``); a test replaces only data locations as text
(``s3://bucket``, a shared folder, a scheduler or master address). Blocks that still get names
from their test: the Dask twin of the ML pipelines guide (``client``, ``ddf``, ``make_model``),
and Getting started's Dask block (the program above it). ``RUN_BY`` names, for every block, the test
that runs it (by a line the block contains); a block that no test runs and ``NOT_RUN`` does not
list fails the first test. Blocks are found by that line in whichever page holds them, so a block
moved between pages is still run.
"""

from __future__ import annotations

import ast
import json
import math
import os
import pathlib
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import duotf
import duotf.io.tfrecord

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
#: the pages whose code blocks run here: the README and every page of the docs site
PAGES = [README] + sorted((ROOT / "docs").rglob("*.md"))
#: fence languages that are not code: what a page shows (output, a diff), run by nobody
NOT_CODE = {"text", "diff"}

#: the install command of the README and of Getting started, which CI runs
QUICKSTART = 'python3 -m pip install -e ".[spark,dask,tensorflow-cpu,dev]" && python3 examples/digits/train.py'

#: a line of each code block -> the test below that runs the block
RUN_BY = {
    'rows = [{"x": [i / 100, 1 - i / 100]': "test_the_readme_example_trains_on_the_embedded_backend",
    QUICKSTART: "test_quickstart_commands_are_what_ci_runs_and_the_example_trains",
    "def main(args, ctx):                       # runs once per node": "test_your_program_trains_and_saves",
    "# the rows this page feeds: 400, in 4 partitions": "test_the_feeding_block_trains_and_scores_every_row",
    "def train_main(args, ctx):": "test_the_feeding_block_trains_and_scores_every_row",
    "# the rows this page fits on: 400, in 4 partitions": "test_the_keras_fit_block_trains_on_the_feed",
    "def fit_main(args, ctx):": "test_the_keras_fit_block_trains_on_the_feed",
    "# the rows this page scores: 400, in 4 partitions": "test_the_spark_scoring_block_scores_every_row",
    "def report_main(args, ctx):": "test_the_metrics_block_reports_and_shows_progress",
    "from duotf.spark import feed_cache, pack_tensors": "test_the_feed_cache_block_feeds_every_epoch",
    "from duotf.io.tfrecord import": "test_the_io_block_round_trips_the_rows",
    "# the rows this page writes: 400, in 4 partitions": "test_the_io_block_round_trips_the_rows",
    "estimator = TFEstimator(modelFn=make_model": "test_getting_started_trains_on_two_machines_that_share_no_tmp",
    "train_on_spark.py /mnt/shared/duotf-models": "test_getting_started_trains_on_two_machines_that_share_no_tmp",
    "$DUOTF_MAIN run": "test_the_run_command_runs_under_spark_submit",
    'client = Client("tcp://scheduler:8786")': "test_the_dask_block_runs_the_program_above",
    "runs = duotf.run_parallel(": "test_the_parallel_block_reports_every_run_in_its_slot",
    'ports="41000-41100"': "test_the_ports_block_runs_its_nodes_in_the_range",
    "spec=duotf.ClusterSpec(workers=2), tls=True": "test_the_tls_block_feeds_every_row",
    "score = duotf.predict_udf(": "test_the_spark_scoring_block_scores_every_row",
    "scored = duotf.dask.predict(": "test_the_dask_scoring_block_scores_every_row",
    "# the rows the Dask example scores": "test_the_dask_scoring_block_scores_every_row",
    "from duotf.spark import TFEstimator, TFModel": "test_the_ml_block_fits_transforms_and_saves",
    "# the rows the stages fit and score: 400, in 4 partitions": "test_the_ml_block_fits_transforms_and_saves",
    "est = duotf.dask.TFEstimator(": "test_the_dask_ml_block_fits_and_predicts",
    "spec = duotf.ClusterSpec(workers=2, gpus_per_node=1)": "test_the_gpu_block_gives_each_node_its_own_gpu",
    "python3 -m duotf doctor": "test_the_doctor_command_names_the_faults_and_exits_1",
    "python3 -m duotf run": "test_the_run_command_prints_every_main_value_as_json",
    "def summaries_main(args, ctx):": "test_the_tensorboard_block_serves_and_keeps_the_events",
    "def resumable_main(args, ctx):": "test_the_restart_block_trains_and_reports_its_restarts",
    "def count_main(args, ctx):": "test_the_spark_connect_block_feeds_every_row_once_an_epoch",
    'df = spark.read.parquet("hdfs:///data/mnist.parquet")': "test_the_petastorm_guide_block_trains_from_parquet",
}

#: a line of each block that cannot run here -> why
NOT_RUN = {
    "venv-pack -o duotf_env.tar.gz": "ships an environment archive to a YARN/Kubernetes cluster's "
                                     "executors (docs/cluster.md): needs venv-pack, a package "
                                     "index and such a cluster, none of which the tests have",
    # docs/install.md: installs into the environment that runs the tests, which .ci/run makes
    # with the superset ".[spark,dask,tensorflow-cpu,dev]"; .ci/wheel-check builds the wheel and
    # installs it with [spark,tensorflow-cpu,examples] into a clean venv and trains from it
    'python3 -m pip install ".[spark,tensorflow-cpu]"': "a subset of what .ci/run installs "
                                                        "before the tests run",
    'python3 -m pip install ".[dask,tensorflow-cpu]"': "a subset of what .ci/run installs "
                                                       "before the tests run",
    'python3 -m pip install ".[tensorflow-cpu]"': "a subset of what .ci/run installs before the "
                                                  "tests run",
    'python3 -m pip install ".[spark-provided,tensorflow-cpu]"': "a subset of what .ci/run "
                                                                "installs before the tests run "
                                                                "(tests/test_packaging.py: the "
                                                                "spark extra less pyspark)",
    "python3 -m pip wheel --no-deps -w dist .": ".ci/wheel-check runs these steps (in a temp dir, "
                                               "adding [examples]) on every CI run",
    ".ci/wheel-check": ".ci/run runs it on every CI run",
    'pip install -e ".[spark,dask,tensorflow-cpu,dev]"\n': "the install line of .ci/run, which "
                                                        "runs it before the tests run",
    # docs/platforms/: the cluster managers and services that no test here runs (each page
    # says so); the settings they pass are the ones the tests' standalone clusters need
    "--master yarn --deploy-mode cluster \\\n  --archives": "YARN (EMR): no YARN cluster runs here",
    "spark.yarn.appMasterEnv.DUOTF_PORTS=41000-41300": "YARN (EMR): no YARN cluster runs here",
    "$DUOTF_MAIN doctor --backend spark --workers 2": "YARN (EMR): no YARN cluster runs here",
    "FROM apache/spark:": "builds and pushes a container image: no Docker daemon or registry "
                          "here",
    "--master k8s://": "Kubernetes: no Kubernetes cluster runs here",
    'modelDir="/Volumes/main/default/models"': "a Databricks notebook's spark and Unity Catalog "
                                               "volume: no Databricks workspace here",
    "gcloud dataproc clusters create": "Google Cloud Dataproc: no cloud project here",
    "gcloud dataproc jobs submit pyspark train_on_spark.py": "Google Cloud Dataproc: no cloud "
                                                            "project here",
    "-- doctor --backend spark --workers 2": "Google Cloud Dataproc: no cloud project here",
    # docs/guides/petastorm.md's "before": tests/test_petastorm_bench.py checks its calls
    "converter = make_spark_converter(df)": "petastorm 0.13.1 imports only with pyarrow 14 and "
                                            "numpy < 2, not in this environment (pyarrow 26): "
                                            "python -m benchmarks.petastorm --guide runs it in "
                                            "the benchmark's own venv",
}


def code_blocks():
    """``(place, language, code)`` of every fenced block with a language in the README and the
    docs; ``place`` is ``path:line``. A fence may be indented (a block inside a list item)."""
    found = []
    for page in PAGES:
        lines = page.read_text().splitlines()
        i = 0
        while i < len(lines):
            opening = re.match(r"^(\s*)```(\w+)\s*$", lines[i])
            if lines[i].lstrip().startswith("```"):
                end = next(j for j in range(i + 1, len(lines)) if lines[j].lstrip().startswith("```"))
                if opening:
                    indent = len(opening.group(1))
                    code = "\n".join(line[indent:] for line in lines[i + 1:end]) + "\n"
                    found.append((f"{page.relative_to(ROOT)}:{i + 1}", opening.group(2), code))
                i = end
            i += 1
    return found


def blocks(line: str) -> list:
    """Every code block (of any page) containing ``line``."""
    return [code for _, _, code in code_blocks() if line in code]


def block(line: str, data: dict = None) -> str:
    """The one code block containing ``line``, with data locations replaced as ``data`` says."""
    (code,) = blocks(line)
    for old, new in (data or {}).items():
        assert old in code, f"the block no longer names {old!r}"
        code = code.replace(old, new)
    return code


def page_code(line: str) -> str:
    """The block containing ``line`` with every python block of its page before it, in the
    page's order: what a user runs who copies the page's examples one after the other."""
    found = [(place, language, code) for place, language, code in code_blocks()]
    (place,) = [place for place, _, code in found if line in code]
    page, at = place.rsplit(":", 1)
    return "\n".join(code for where, language, code in found
                     if language == "python" and where.rsplit(":", 1)[0] == page
                     and int(where.rsplit(":", 1)[1]) <= int(at))


def run_block(code: str, as_written: bool = False, **names) -> dict:
    """Run ``code`` as a script with ``names`` defined; its globals after the run.
    ``as_written``: nothing is defined for it, not even ``duotf`` (a page's own blocks).

    The code is compiled from a file of its own, so that TensorFlow (AutoGraph) can read its
    functions' source, under a module name no one can import, so that its functions travel to
    the nodes by value as a script's would.
    """
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix="_readme_block.py", delete=False) as f:
        f.write(code)
    namespace = dict(names, __name__="readme_block", __file__=f.name)
    if not as_written:
        namespace.setdefault("duotf", duotf)  # the README's first block imports it for the others
    try:
        exec(compile(code, f.name, "exec"), namespace)
        return namespace
    finally:
        os.unlink(f.name)


def test_every_code_block_of_the_readme_and_the_docs_is_run_or_says_why_not():
    found = code_blocks()
    assert any(place.startswith("README.md:") for place, _, _ in found)
    assert any(place.startswith("docs/") for place, _, _ in found)
    for place, language, code in found:
        if language in NOT_CODE:
            continue
        assert language in ("python", "bash"), f"{place}: a ```{language} block (code is python or bash)"
        runs = [test for key, test in RUN_BY.items() if key in code]
        skipped = [key for key in NOT_RUN if key in code]
        assert len(runs) + len(skipped) == 1, (
            f"{place}: no test runs this block (add it to RUN_BY, or to NOT_RUN with the reason)")
        assert not runs or callable(globals()[runs[0]])
        assert not skipped or len(NOT_RUN[skipped[0]]) > 20  # a reason, not a shrug
    # every entry still names a block: none was left behind when its block moved or went
    for key in list(RUN_BY) + list(NOT_RUN):
        assert any(key in code for _, _, code in found), f"no block contains {key!r} any more"


def test_quickstart_commands_are_what_ci_runs_and_the_example_trains(tmp_path):
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    codes = blocks(QUICKSTART)  # the README's and Getting started's
    assert len(codes) == 2 and codes[0] == codes[1]
    install_and_example, test_command = codes[0].strip().splitlines()
    # .ci/run runs both lines as they are written, the first before anything else is installed
    assert install_and_example in ci and test_command in ci
    assert ci.index(install_and_example) < ci.index(test_command)
    assert not any("pip install" in line for line in ci[:ci.index(install_and_example)])
    example = install_and_example.split(" && ")[1]
    assert example == "python3 examples/digits/train.py"
    # the example keeps its data and model in a new temp folder (it prints where): the test's
    out = subprocess.run([sys.executable] + example.split()[1:], cwd=ROOT, capture_output=True,
                         text=True, timeout=300, env=dict(os.environ, TMPDIR=str(tmp_path)))
    assert out.returncode == 0, out.stderr[-3000:]
    accuracy = float(re.search(r"test accuracy=([\d.]+)", out.stdout).group(1))
    assert accuracy > 0.9, out.stdout
    # its nodes convert its tf.functions (their source travels with the job): no AutoGraph notice
    assert "AutoGraph could not transform" not in out.stderr, out.stderr[-3000:]


@pytest.mark.engines("local")
def test_the_readme_example_trains_on_the_embedded_backend(backend, capsys):
    ns = run_block(block('rows = [{"x": [i / 100, 1 - i / 100]'))
    losses = ns["losses"]
    assert len(losses) == 2 and losses[0] == losses[1]  # one model, synchronously trained
    assert math.isfinite(losses[0]) and losses[0] < 0.05  # y = 3 * x[0] is learnt
    assert str(losses) in capsys.readouterr().out


# -- the Spark blocks, on Spark local[3] ------------------------------------------------------
def _frame(spark, rows: int = 400, width: int = 6, parts: int = 4):
    data = [(i, [float(i % 7 + j) for j in range(width)], float(i % 2)) for i in range(rows)]
    return spark.createDataFrame(data, "id long, features array<float>, label double").repartition(parts)


@pytest.mark.engines("spark-local")
def test_your_program_trains_and_saves(backend, engine, tmp_path):
    # the block takes the session the engine made (getOrCreate), as a notebook's would
    code = block("def main(args, ctx):                       # runs once per node", {
        '"/mnt/shared/duotf-models/regression.keras"': repr(str(tmp_path / "regression.keras")),
    })
    ns = run_block(code)
    assert ns["spark"] is engine.session
    losses = ns["results"]
    assert len(losses) == 2 and all(isinstance(v, float) and math.isfinite(v) for v in losses)
    assert max(losses) < 0.05  # y = x @ [0.1 .. 0.8] is learnt
    assert (tmp_path / "regression.keras").stat().st_size > 0


@pytest.mark.engines("spark-local")
def test_the_restart_block_trains_and_reports_its_restarts(backend, engine, tmp_path):
    ns = run_block(block("def resumable_main(args, ctx):", {
        '"/mnt/shared/duotf-checkpoints"': repr(str(tmp_path / "checkpoints"))}), as_written=True)
    assert ns["spark"] is engine.session
    saved = list((tmp_path / "checkpoints").rglob("*.npz"))
    assert len(saved) == 2 * 10, saved  # every node's every epoch, in the folder given
    assert ns["cluster"].restarts == []  # nothing failed
    for w in ns["weights"]:
        np.testing.assert_allclose(w, [1.0, -2.0, 0.5], atol=0.05)


@pytest.mark.engines("spark-local")
def test_the_tensorboard_block_serves_and_keeps_the_events(backend, engine, tmp_path):
    ns = run_block(block("def summaries_main(args, ctx):", {
        '"/shared/tensorboard"': repr(str(tmp_path / "tb"))}), as_written=True)
    assert ns["spark"] is engine.session
    cluster = ns["cluster"]
    assert ns["url"].startswith(f"http://{cluster.nodes[0].host}:") and ns["steps"] == [100, 100]
    kept = list((tmp_path / "tb" / cluster.job_id).iterdir())  # the chief's events, kept
    assert len(kept) == 1 and kept[0].name.startswith("events.out.tfevents."), kept


@pytest.mark.engines("spark-local")
def test_the_feeding_block_trains_and_scores_every_row(backend, engine):
    # the page's own session (getOrCreate: the engine's) and DataFrame; no name is given
    ns = run_block(page_code("def train_main(args, ctx):"), as_written=True)
    assert ns["spark"] is engine.session
    assert sum(ns["rows"]) == 3 * 400 and ns["rows"][0] == ns["rows"][1]
    out = ns["out"].toPandas()
    assert sorted(out["id"]) == list(range(400))
    expected = out["id"].map(lambda i: sum(float(i % 7 + j) for j in range(6)))
    np.testing.assert_allclose(out["prediction"], expected)


@pytest.mark.engines("spark-local")
def test_the_keras_fit_block_trains_on_the_feed(backend, engine):
    ns = run_block(page_code("def fit_main(args, ctx):"), as_written=True)
    assert ns["spark"] is engine.session
    first, second = ns["losses"]
    assert first == second and len(first) == 3 and all(map(math.isfinite, first))
    assert first[-1] < first[0]


@pytest.mark.engines("spark-local")
def test_the_petastorm_guide_block_trains_from_parquet(backend, engine, tmp_path):
    """docs/guides/petastorm.md's duotf program, on a Parquet folder of 400 MNIST-shaped rows
    whose label is the index of their largest feature: 10 epochs of 2 steps, the same loss on
    both nodes (one model), going down."""
    rng = np.random.default_rng(0)
    labels = np.arange(400) % 10
    x = rng.random((400, 784), dtype=np.float32) * 0.1
    x[np.arange(400), labels] = 1.0
    rows = [(x[i].tolist(), int(labels[i])) for i in range(400)]
    path = str(tmp_path / "mnist.parquet")
    engine.session.createDataFrame(rows, "features array<float>, label long").repartition(4) \
        .write.parquet(path)
    ns = run_block(block('df = spark.read.parquet("hdfs:///data/mnist.parquet")',
                         {"hdfs:///data/mnist.parquet": path}), as_written=True)
    assert ns["spark"] is engine.session
    first, second = ns["losses"]
    assert first == second and len(first) == 10 and all(map(math.isfinite, first))
    assert first[-1] < first[0]


@pytest.mark.engines("local")
def test_the_metrics_block_reports_and_shows_progress(backend, capsys):
    ns = run_block(block("def report_main(args, ctx):"), as_written=True)
    df = ns["cluster"].metrics
    for node in ("worker:0", "worker:1"):
        rows = df[df["node"] == node]
        assert rows["step"].tolist() == list(range(100, 2001, 100))  # 1,000 rows an epoch each
        assert rows["loss"].iloc[-1] == 1 / 2000
    out, err = capsys.readouterr()
    assert "worker:0 2000 {'rows': 2000, 'loss': 0.0005}" in out  # the callback
    assert "worker:1 2000" in out and "Name: loss" in out  # and the last losses
    for epoch in (1, 2):
        last = [s for s in re.split(r"[\r\n]", err) if f"feed epoch {epoch}/2" in s][-1]
        assert "2000/2000" in last, err


@pytest.mark.engines("spark-local")
def test_the_feed_cache_block_feeds_every_epoch(backend, engine):
    ns = run_block(page_code("from duotf.spark import feed_cache, pack_tensors"), as_written=True)  # the page's blocks
    cached, packed = (sum(per_node) for per_node in zip(*ns["rows"]))
    assert cached == packed == 10 * 400


@pytest.mark.engines("spark-local")
def test_the_io_block_round_trips_the_rows(backend, engine, tmp_path):
    import dask

    bucket = f"file://{tmp_path}/bucket"
    code = page_code("from duotf.io.tfrecord import").replace('"s3://bucket', f'"{bucket}')
    with dask.config.set(scheduler="synchronous"):  # no thread pool left behind by Dask
        ns = run_block(code, as_written=True)
        assert len(ns["ddf"].compute()) == 400
    assert ns["spark"] is engine.session
    records, df = ns["records"], ns["df"]
    assert list(duotf.io.tfrecord.read_records(f"{bucket}/x.tfrecord.gz", "infer")) == records
    assert len(ns["files"]) == df.rdd.getNumPartitions()
    assert ns["df2"].count() == 400 and dict(ns["df2"].dtypes)["name"] == "string"
    assert len(list((tmp_path / "bucket" / "out").iterdir())) >= 1


@pytest.mark.engines("spark-local")
def test_the_parallel_block_reports_every_run_in_its_slot(backend, engine, capsys):
    ns = run_block(block("runs = duotf.run_parallel("), as_written=True)
    assert ns["spark"] is engine.session
    runs = ns["runs"]
    assert [run.args["lr"] for run in runs] == [0.3, 0.03, 3.0]
    assert [run.ok for run in runs] == [True, True, False]
    assert runs[2].error.remote_type == "FloatingPointError" and "lr=3.0 diverged" in str(runs[2].error)
    assert ns["best"] is runs[0] and runs[0].value[0] < 1e-3 < runs[1].value[0]
    assert "FloatingPointError" in capsys.readouterr().out


def test_the_ports_block_runs_its_nodes_in_the_range(capsys):
    # docs/cluster.md, Ports and firewalls (tests/test_ports.py and the shared suite's
    # test_ports check the ports themselves)
    run_block(block('ports="41000-41100"'))
    assert capsys.readouterr().out.strip().splitlines()[-1] == "[0, 1]"


def test_the_tls_block_feeds_every_row(capsys):
    # docs/cluster.md, Encryption in transit (tests/test_tls.py reads the wire itself, and the
    # shared suite's test_feed feeds with TLS on every engine)
    run_block(block("spec=duotf.ClusterSpec(workers=2), tls=True"))
    assert capsys.readouterr().out.strip().splitlines()[-1] == "[50, 50]"


@pytest.mark.engines("dask")
def test_the_dask_block_runs_the_program_above(backend, engine, tmp_path):
    program = block("def main(args, ctx):                       # runs once per node", {
        '"/mnt/shared/duotf-models/regression.keras"': repr(str(tmp_path / "regression.keras")),
    })
    # the program's definitions (main, args), without its session: a Dask user has none
    definitions = program[:program.index("spec = duotf.ClusterSpec")]
    definitions = definitions.replace("spark = SparkSession.builder.getOrCreate()\n", "")
    ns = run_block(definitions)
    code = block('client = Client("tcp://scheduler:8786")',
                 {"tcp://scheduler:8786": engine.handle.scheduler.address})
    ns = run_block(code, **{k: ns[k] for k in ("main", "args", "duotf")})
    try:
        assert (tmp_path / "regression.keras").stat().st_size > 0
    finally:
        ns["client"].close()


def test_getting_started_trains_on_two_machines_that_share_no_tmp(spark_hosts_private_tmp,
                                                                      tmp_path):
    """Getting started's Spark tutorial as a user runs it: the program saved as its page says,
    the spark-submit command (with the master's URL and a shared folder for the models) run on
    a standalone cluster of 2 separate hosts, each with a /tmp of its own."""
    import shutil
    import tempfile

    net, master = spark_hosts_private_tmp
    # the premise: what the driver writes in /tmp, a host does not see
    marker = tmp_path / "the-drivers-own"
    marker.write_text("")
    assert net.start(0, ["test", "!", "-e", str(marker)]).wait(60) == 0
    shared = tempfile.mkdtemp(prefix="duotf-shared-", dir="/var/tmp")  # a shared mount's stand-in
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable,
               SPARK_LOCAL_IP=net.driver_ip)  # the driver machine's address on the hosts' network
    try:
        (pathlib.Path(shared) / "train_on_spark.py").write_text(
            block("estimator = TFEstimator(modelFn=make_model"))
        command = block("train_on_spark.py /mnt/shared/duotf-models", {
            "spark://master:7077": master, "/mnt/shared/duotf-models": shared + "/models",
        }).replace("\\\n", " ")
        out = subprocess.run(["bash", "-c", command], cwd=shared, capture_output=True, text=True,
                             env=env, timeout=300)
        problems = [line for line in out.stderr.splitlines() if " INFO " not in line]
        assert out.returncode == 0, "\n".join(problems[-60:] + out.stdout.splitlines()[-60:])
        said = re.search(r"test accuracy ([\d.]+); model saved at (\S+)", out.stdout)
        assert said and float(said.group(1)) > 0.9, out.stdout[-3000:]
        assert said.group(2).startswith(shared + "/models/fit-") and os.path.exists(said.group(2))
        # its executors ran on both hosts
        logs = [pathlib.Path(net.folder, name).read_text()
                for name in os.listdir(net.folder) if name.startswith("spark-worker")]
        assert len(logs) == 2 and all(
            any("Asked to launch executor" in line and "duotf-getting-started" in line
                for line in log.splitlines()) for log in logs), logs
    finally:
        shutil.rmtree(shared, ignore_errors=True)


def test_the_run_command_runs_under_spark_submit(spark_standalone_master, spark_standalone_master_log):
    with open(spark_standalone_master_log) as f:
        apps = f.read().count("Registering app ")
    command = block("$DUOTF_MAIN run", {
        "python3": sys.executable, "spark://master:7077": spark_standalone_master,
        "mypackage.train:main": "tests.suite.mains:argv_main"}).replace("\\\n", " ")
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    out = subprocess.run(["bash", "-c", command], cwd=ROOT, capture_output=True, text=True,
                         env=env, timeout=300)
    problems = [line for line in out.stderr.splitlines() if " INFO " not in line]
    assert out.returncode == 0, "\n".join(problems[-60:] + out.stdout.splitlines()[-60:])
    results = json.loads(out.stdout.strip().splitlines()[-1])  # the values, as the last line
    assert [r["role"] for r in results] == ["worker:0", "worker:1"]
    assert all(r["args"] == ["--epochs", "3", "--data", "/data/digits.npz"] for r in results)
    for i in (0, 1):  # spark-submit merges its Python driver's stderr into its stdout
        assert f"[worker:{i}] argv_main worker:{i} got --epochs 3" in out.stdout, out.stdout[-3000:]
    with open(spark_standalone_master_log) as f:  # spark-submit's master, not a local one
        assert f.read().count("Registering app ") == apps + 1


# -- the scoring blocks -----------------------------------------------------------------------
def _scoring_model(tmp_path, width: int = 6):
    """A tiny model of one input saved as .keras; its path and the model. Its input is not named
    after the blocks' column ("features"), as a user's model's need not be: the blocks name it."""
    import keras

    inputs = keras.Input((width,), name="pixels")
    model = keras.Model(inputs, keras.layers.Dense(1)(keras.layers.Dense(4, activation="relu")(inputs)))
    path = str(tmp_path / "model.keras")
    model.save(path)
    return path, model


@pytest.mark.engines("spark-connect")
def test_the_spark_connect_block_feeds_every_row_once_an_epoch(backend, spark_connect_server, capsys):
    ns = run_block(block("def count_main(args, ctx):",
                         {"sc://connect-server:15002": spark_connect_server}))
    assert ns["cluster"].backend.client.connect  # the session the block made is a Connect one
    assert capsys.readouterr().out.strip().splitlines()[-1] == "2000"


@pytest.mark.engines("spark-local")
def test_the_spark_scoring_block_scores_every_row(backend, engine, tmp_path):
    path, model = _scoring_model(tmp_path)
    code = page_code("score = duotf.predict_udf(")  # the page's DataFrame, then the block
    ns = run_block(code.replace('"s3://bucket/models/model.keras"', repr(path)), as_written=True)
    assert ns["spark"] is engine.session
    scored = ns["scored"].toPandas().sort_values("id")
    same = ns["same"].toPandas().sort_values("id")
    x = np.stack([np.asarray(v, dtype="float32") for v in scored["features"]])
    expected = model.predict(x, verbose=0)[:, 0]
    assert len(scored) == 400
    np.testing.assert_allclose(scored["prediction"], expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(same["prediction"], expected, rtol=1e-5, atol=1e-6)


@pytest.mark.engines("dask")
def test_the_dask_scoring_block_scores_every_row(backend, engine, tmp_path):
    # the page's Dask blocks as a Dask user copies them: its client (a LocalCluster of its own)
    # and DataFrame, then the scoring block; only the model's location is replaced
    path, model = _scoring_model(tmp_path)
    code = (block("# the rows the Dask example scores") + "\n"
            + block("scored = duotf.dask.predict(", {"s3://bucket/models/model.keras": path}))
    ns = {}
    try:
        ns = run_block(code, as_written=True)
        out = ns["scored"].compute()
    finally:
        if "client" in ns:
            ns["client"].close()
    x = np.stack([np.arange(6, dtype="float32") + i % 7 for i in range(400)])
    assert out["id"].tolist() == list(range(400))
    np.testing.assert_allclose(out["prediction"], model.predict(x, verbose=0)[:, 0], rtol=1e-5, atol=1e-6)


_ML_PATHS = {"/shared/models": "models", "/shared/tfmodel": "tfmodel"}


def _ml_block(tmp_path, page: bool = False):
    """The Spark ML block (``page``: with its page's setup before it), its folders in
    ``tmp_path``."""
    code = (page_code if page else block)("from duotf.spark import TFEstimator, TFModel")
    for old, new in _ML_PATHS.items():
        assert old in code
        code = code.replace(old, str(tmp_path / new))
    return code


@pytest.mark.engines("spark-local")
def test_the_ml_block_fits_transforms_and_saves(backend, engine, tmp_path):
    ns = run_block(_ml_block(tmp_path, page=True), as_written=True)
    df = ns["df"]
    assert ns["spark"] is engine.session
    loss = ns["model"].history["loss"]
    assert len(loss) == 2 and all(map(math.isfinite, loss))
    scored = ns["scored"].orderBy("id").toPandas()
    assert scored["id"].tolist() == list(range(400)) and np.isfinite(scored["prediction"]).all()
    again = ns["same"].transform(df).orderBy("id").toPandas()
    assert np.array_equal(again["prediction"], scored["prediction"])
    assert len(list((tmp_path / "models").glob("fit-*/model.keras"))) == 1


@pytest.mark.engines("dask")
def test_the_dask_ml_block_fits_and_predicts(backend, engine, tmp_path):
    import dask
    import dask.dataframe as dd
    import pandas as pd

    spark_block = _ml_block(tmp_path)
    ns = run_block(spark_block[:spark_block.index("est = TFEstimator(")])  # make_model
    rows = [(i, np.array([float(i % 7 + j) for j in range(6)], np.float32), float(i % 2))
            for i in range(400)]
    with dask.config.set({"dataframe.convert-string": False}):
        ddf = dd.from_pandas(pd.DataFrame(rows, columns=["id", "features", "label"]), npartitions=4)
    code = block("est = duotf.dask.TFEstimator(", {"/shared/models": str(tmp_path / "models")})
    ns = run_block(code, make_model=ns["make_model"], client=engine.client, ddf=ddf)
    out = engine.to_pandas(ns["predictions"])
    assert out["id"].tolist() == list(range(400)) and np.isfinite(out["prediction"]).all()
    x = np.stack(out["features"].to_numpy())
    np.testing.assert_allclose(ns["keras_model"].predict(x, verbose=0)[:, 0], out["prediction"],
                               rtol=1e-5, atol=1e-6)
    assert len(ns["model"].history["loss"]) == 2


# -- the GPU block, on a standalone cluster whose worker has 2 fake GPUs ---------------------------
#: run after the GPU block (docs/guides/gpus.md), in its driver: what the nodes' records say, the errors of
#: specs that do not fit, and a feed beside GPU nodes (its tasks must take no GPU)
_GPU_CHECKS = textwrap.dedent("""
    print([list(node.gpus) for node in cluster.nodes])
    for bad in (duotf.ClusterSpec(gpus_per_node=3), duotf.ClusterSpec(workers=3, gpus_per_node=1)):
        try:
            duotf.run(where_am_i, backend=spark, spec=bad)
        except duotf.DuotfError as err:
            print(repr((type(err).__name__, str(err))))
    import cloudpickle, pyspark.cloudpickle
    from tests.suite import mains
    cloudpickle.register_pickle_by_value(mains)
    pyspark.cloudpickle.register_pickle_by_value(mains)
    rows = spark.sparkContext.parallelize([(i, i) for i in range(20)], 2)
    with duotf.run(mains.feed_train_main, {"batch": 5}, backend=spark, spec=spec) as cluster:
        print(cluster.train(rows, epochs=1)["rows_fed"])
        cluster.wait(timeout=120)
    spark.stop()
""")


def test_the_gpu_block_gives_each_node_its_own_gpu(spark_gpu_master):
    url, script = spark_gpu_master
    code = block("spec = duotf.ClusterSpec(workers=2, gpus_per_node=1)", {
        "spark://master:7077": url,
        "/opt/spark/examples/src/main/scripts/getGpusResources.sh": script,
    })
    # The test's own settings go in before the block's; the executor sees devices 5 and 7, so
    # Spark's addresses 0 and 1 must become those.
    conf = {"spark.ui.enabled": "false", "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1", "spark.executor.memory": "1g",
            "spark.executorEnv.CUDA_VISIBLE_DEVICES": "5,7"}
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable,
               PYSPARK_SUBMIT_ARGS=" ".join(f"--conf {k}={v}" for k, v in conf.items())
               + " pyspark-shell")
    program = code + _GPU_CHECKS  # the block as written, then the checks
    out = subprocess.run([sys.executable, "-c", program], cwd=ROOT, capture_output=True,
                         text=True, env=env, timeout=240)
    problems = [line for line in out.stderr.splitlines() if " INFO " not in line]
    assert out.returncode == 0, "\n".join(problems[-60:] + out.stdout.splitlines()[-20:])
    seen, nodes, too_many, too_few, fed = map(ast.literal_eval, out.stdout.strip().splitlines()[-5:])
    assert sorted(seen) == [(["5"], "5"), (["7"], "7")]  # one device each, never the same
    assert sorted(nodes) == [["5"], ["7"]]
    assert too_many[0] == "ConfigError" and "spark.executor.resource.gpu.amount=2" in too_many[1]
    assert too_few[0] == "InsufficientSlotsError" and "room for 2" in too_few[1]
    assert fed == 20  # the feeding tasks ran beside the nodes, which held both GPUs


# -- the command line -------------------------------------------------------------------------
@pytest.mark.engines("dask")
def test_the_doctor_command_names_the_faults_and_exits_1(backend, engine, tmp_path):
    """The faults of tests/suite/test_doctor.py through the command line: another TensorFlow
    first on the nodes' PYTHONPATH (the block's --env) and an address nobody listens on."""
    from tests.suite.test_doctor import closed_port, shadow_tensorflow

    shadow = shadow_tensorflow(tmp_path)
    with closed_port() as sock:
        address = "127.0.0.1:%d" % sock.getsockname()[1]
        command = block("python3 -m duotf doctor", {
            "python3": sys.executable, "/opt/mylibs": shadow, "namenode:8020": address,
            "--dask-scheduler tcp://scheduler:8786": " ".join(engine.cli_args()),
        }).replace("\\\n", " ")
        out = subprocess.run(["bash", "-c", command], cwd=ROOT, capture_output=True, text=True,
                             timeout=300)
    rows = out.stdout
    assert out.returncode == 1, rows + out.stderr[-3000:]
    assert re.search(r"^tensorflow +FAIL +.*TensorFlow 0\.0\.injected", rows, re.M), rows
    assert re.search(rf"^reach {address} +FAIL +.*refused", rows, re.M | re.I), rows
    for name in ("slots", "python", "duotf", "distributed", "driver port", "node ports"):
        assert re.search(rf"^{name} +OK ", rows, re.M), rows
    assert "fix: install one TensorFlow" in rows and "check(s) failed" in rows


@pytest.mark.engines("local", "dask", "spark-connect")
def test_the_run_command_prints_every_main_value_as_json(backend, engine):
    command = block("python3 -m duotf run", {
        "python3": sys.executable, "mypackage.train:main": "tests.suite.mains:argv_main",
        "--dask-scheduler tcp://scheduler:8786": " ".join(engine.cli_args()),
    }).replace("\\\n", " ")
    out = subprocess.run(["bash", "-c", command], cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    results = json.loads(out.stdout)  # stdout holds the values and nothing else
    assert [r["role"] for r in results] == ["worker:0", "worker:1"]
    assert all(r["args"] == ["--epochs", "3", "--data", "/data/digits.npz"] for r in results)
    for i in (0, 1):  # the nodes' output on stderr, prefixed, as it was written
        assert f"[worker:{i}] argv_main worker:{i} got --epochs 3" in out.stderr, out.stderr
