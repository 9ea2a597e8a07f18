"""Resuming an interrupted fit (``runId``): a driver killed after its fit's second epoch, and the
fit given the same ``runId`` again goes on from the checkpoint of that epoch.

The driver runs in a process of its own, fitting on the engine under test (a Dask client of the
engine's scheduler; on Spark a ``local[3]`` session of its own, as a driver always has its own
Spark application; on Spark Connect a client of the same server, whose process is the driver
of duotf's cluster). Its callback holds every worker at the end of epoch 2, after the chief's
checkpoint; the test then SIGKILLs it, checks that its nodes end (their agent sees the driver
gone, or their node processes miss the agent's pings for ``heartbeat_timeout``), and fits again
with the same ``runId`` in this process.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import threading

import numpy as np
import pytest

import duotf
from duotf.testing import node_processes, poll_for
from duotf.testing.suite import mains
from duotf.testing.suite.test_estimator import BATCH, ENV, SCHEMA, SEED, SIZES, WORKERS, linear_parts

EPOCHS, HELD_AT = 5, 2
#: the killed driver's heartbeat_timeout: its node processes end within it when their agent goes.
#: 20 s, not less: at 10 a node of the driver's fit missed its heartbeats for 10.7 s in CI (the
#: fast tier under coverage on 2 busy cores) and failed the fit before epoch 2
DRIVER_HEARTBEAT_TIMEOUT = 20.0

_DRIVER = """
import sys
from duotf.testing.suite.test_resume import fit_in_a_driver
fit_in_a_driver(*sys.argv[1:])
"""


def _params(model_dir: str, held: str) -> dict:
    return dict(modelFn=mains.linear_model_fn, numWorkers=WORKERS, epochs=EPOCHS, batchSize=BATCH,
                seed=SEED, modelDir=model_dir, runId="linear-1", env=ENV,
                callbacks=_partial(mains.hold_after_epoch, held, HELD_AT) if held else None)


def _partial(fn, *args):
    import functools

    return functools.partial(fn, *args)


def fit_in_a_driver(where: str, model_dir: str, held: str) -> None:
    """The killed driver (run as ``python -c``): fit with ``runId`` on ``where`` (``dask:<scheduler
    address>`` or ``spark:<master>``); its workers hold at the end of epoch 2 until it is killed."""
    import pandas as pd

    rows = [r for part in linear_parts() for r in part]
    frame = pd.DataFrame({"id": [r[0] for r in rows], "features": [r[1] for r in rows],
                          "label": [r[2] for r in rows]})
    kind, address = where.split(":", 1)
    params = _params(model_dir, held)
    if kind == "dask":
        import dask.dataframe as dd
        from distributed import Client

        import duotf.dask

        client = Client(address)
        snake = {"modelFn": "model_fn", "numWorkers": "num_workers", "batchSize": "batch_size",
                 "modelDir": "model_dir", "runId": "run_id"}
        estimator = duotf.dask.TFEstimator(client=client, **{snake.get(k, k): v for k, v in params.items()})
        import dask

        with dask.config.set({"dataframe.convert-string": False}):  # lists stay lists
            ddf = dd.from_pandas(frame, npartitions=len(SIZES))
        estimator.fit(ddf)
    else:
        from pyspark.sql import SparkSession

        import duotf.spark

        session = (SparkSession.builder.remote(address).getOrCreate() if kind == "connect" else
                   SparkSession.builder.master(address).config("spark.ui.enabled", "false")
                   .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
                   .config("spark.pyspark.python", sys.executable).getOrCreate())
        ddl = ", ".join(f"`{name}` {kind}" for name, kind in SCHEMA.items())
        df = session.createDataFrame(frame.values.tolist(), ddl).repartition(len(SIZES))
        duotf.spark.TFEstimator(**params).fit(df)
    raise SystemExit("the fit was not held at epoch 2: the test kills this driver there")


def _where(engine) -> str:
    if getattr(engine, "url", "").startswith("sc://"):  # a client of the same Connect server
        return "connect:" + engine.url
    session = getattr(engine, "session", None)
    if session is not None:
        return "spark:local[3]"  # a driver of its own has an application of its own
    return "dask:" + engine.client.scheduler.address


def _resume_at_once(fit, owner, release):
    """``fit()`` in a thread; once it has taken the run (a new token in the ``owner`` file,
    which goes when the run finishes), the killed fit's held nodes are released (``release``)."""
    token = owner.read_text()
    fitted: dict = {}

    def resume_fit():
        try:
            fitted["model"] = fit()
        except BaseException as exc:  # raised in the test's thread below
            fitted["error"] = exc

    thread = threading.Thread(target=resume_fit, name="resumed-fit")
    thread.start()
    try:
        poll_for(lambda: not thread.is_alive() or not owner.exists() or owner.read_text() != token,
                 120, 0.1, "the resumed fit to take the run")
    finally:
        release.touch()
        thread.join(600)
    if "error" in fitted:
        raise fitted["error"]
    return fitted["model"]


# on Dask, on a classic Spark session (its killed driver an application of its own, local[3])
# and on Spark Connect: the fast tier runs it on one of the first two, the full tier on each
@pytest.mark.engines("dask", "spark-local", "spark-connect")
def test_a_fit_whose_driver_was_killed_resumes_from_its_last_checkpoint(backend, engine, tmp_path,
                                                                        caplog, monkeypatch):
    import logging

    import keras
    import psutil

    TFEstimator, _, extra = engine.ml_stages()
    models, held = tmp_path / "models", tmp_path / "held"
    held.mkdir()
    # a driver killed with SIGKILL cannot remove its own folders (node logs, checkpoints): they
    # go in a temp folder of the test's
    (tmp_path / "driver-tmp").mkdir()
    env = dict(os.environ, DUOTF_HEARTBEAT_TIMEOUT=str(DRIVER_HEARTBEAT_TIMEOUT),
               TMPDIR=str(tmp_path / "driver-tmp"))
    driver = subprocess.Popen([sys.executable, "-c", _DRIVER, _where(engine), str(models), str(held)],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        poll_for(lambda: (held / "held-0").exists() or driver.poll() is not None, 180, 0.2,
                 "the driver's fit at the end of epoch 2")
        assert driver.poll() is None, driver.stdout.read() if driver.stdout else ""
        family = psutil.Process(driver.pid).children(recursive=True)  # its JVM, if Spark
        driver.send_signal(signal.SIGKILL)
        driver.wait(30)
    finally:
        if driver.poll() is None:
            driver.kill()
        if driver.stdout is not None:
            driver.stdout.close()
    state = json.loads((models / "linear-1" / "run.json").read_text())
    assert state["done"] == HELD_AT and not state["finished"]
    assert state["model"] == f"checkpoint-{HELD_AT}.keras" and len(state["history"]["loss"]) == HELD_AT
    assert sorted(os.listdir(models / "linear-1")) == [f"checkpoint-{HELD_AT}.keras", "owner", "run.json"]
    steps_held = int(np.asarray(keras.saving.load_model(
        models / "linear-1" / f"checkpoint-{HELD_AT}.keras").optimizer.iterations))
    assert steps_held > 0

    # what the killed driver left in its temp folder (its node logs, its job's lock): removed by
    # the next run on its host, here the resumed fit's (duotf/_driver/leftovers.py)
    left = [n for n in os.listdir(tmp_path / "driver-tmp") if n.startswith("duotf-")]
    assert any(n.endswith(".lock") for n in left), left
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "driver-tmp"))

    # resumed at once, while the killed fit's nodes still hold at epoch 2 (they end when they
    # miss their driver's heartbeats): the new fit takes the run (a new token in its owner
    # file) before anything else, and the old nodes, released then, commit nothing more
    caplog.set_level(logging.INFO, logger="duotf._ml.estimator")
    name = engine.ml_name
    params = {name(k): v for k, v in _params(str(models), "").items()}
    model = _resume_at_once(lambda: TFEstimator(**params, **extra).fit(
        engine.table(linear_parts(), SCHEMA)), models / "linear-1" / "owner", held / "release")
    # the killed fit's nodes end without their driver (no longer than heartbeat_timeout and a
    # margin for the node to stop), and so does what the driver started (Spark's JVM)
    poll_for(lambda: not node_processes(), DRIVER_HEARTBEAT_TIMEOUT + 20, 0.2,
             "the killed driver's node processes to end")
    poll_for(lambda: not [p for p in family if p.is_running() and p.status() != psutil.STATUS_ZOMBIE],
             30, 0.2, "the killed driver's own processes to end")
    assert getattr(model, name("initialEpoch")) == HELD_AT
    assert len(model.history["loss"]) == EPOCHS and all(math.isfinite(v) for v in model.history["loss"])
    assert model.history["loss"][:HELD_AT] == state["history"]["loss"]
    messages = [r.getMessage() for r in caplog.records]
    assert any(f"resuming after epoch {HELD_AT}" in m for m in messages)
    assert any(f"({EPOCHS - HELD_AT} epoch(s) fed)" in m for m in messages), messages
    # the optimizer's state came with the checkpoint: its step count goes on from there
    local = model.to_local()
    assert int(np.asarray(local.optimizer.iterations)) == steps_held * EPOCHS // HELD_AT
    x = np.array([r[1] for p in linear_parts() for r in p], np.float32)
    assert np.isfinite(local.predict(x, verbose=0)).all()
    state = json.loads((models / "linear-1" / "run.json").read_text())
    assert state["finished"] and state["done"] == EPOCHS
    assert sorted(os.listdir(models / "linear-1")) == ["model.keras", "run.json"]
    assert not set(left) & set(os.listdir(tmp_path / "driver-tmp")), left

    # a finished run: its model, untrained; other parameters: refused, naming them
    again = TFEstimator(**params, **extra).fit(engine.table(linear_parts(), SCHEMA))
    assert engine.model_path(again) == engine.model_path(model)
    assert again.history == model.history and getattr(again, name("initialEpoch")) == EPOCHS
    with pytest.raises(duotf.ConfigError) as info:
        TFEstimator(**dict(params, **{name("batchSize"): 4}), **extra).fit(
            engine.table(linear_parts(), SCHEMA))
    assert f"{name('batchSize')}=8 (now 4)" in str(info.value) and "new " + name("runId") in str(info.value)
