"""The mistakes a new user makes, each with the words that tell them what to change (issue 32).

Each test makes one mistake on the engines where it can be made and asserts what the user sees:
a typo in ``input_mapping``, a Dask DataFrame whose array column Dask turned into strings, a
column of strings fed to a model of numbers, a ``main`` that never reads the feed that
``cluster.train`` fills, and less data than nodes.
"""

from __future__ import annotations

import time

import numpy as np
import pandas as pd
import pytest

import duotf
from duotf.testing import shutdown_quietly
from duotf.testing.suite import mains

SPEC = duotf.ClusterSpec(workers=2)


def _frames(parts=2, rows=8):
    return [pd.DataFrame({"features": np.arange(p * rows, (p + 1) * rows, dtype=np.float64),
                          "label": np.ones(rows)}) for p in range(parts)]


def _train_fails(backend, main, args, data, **train):
    """``cluster.train(data)`` with ``main`` on two workers: the error it raised (or that
    ``cluster.wait`` raised after it), and the seconds it took."""
    cluster = duotf.run(main, args, backend, SPEC)
    try:
        t0 = time.monotonic()
        with pytest.raises(duotf.DuotfError) as info:
            cluster.train(data, epochs=1, **train)
            cluster.wait(timeout=120)
        return info.value, time.monotonic() - t0
    finally:
        shutdown_quietly(cluster)


# -- a key of input_mapping that names no column --------------------------------------------------
@pytest.mark.engines("local", "procpool", "dask", "spark-local", "spark-standalone")
def test_mistake_input_mapping_typo_names_the_key_and_the_columns(backend, engine):
    mapping = {"featurez": "x", "label": "y"}  # a typo for "features"
    err, took = _train_fails(backend, mains.feed_columns_main, {"mapping": mapping},
                             engine.frame(_frames()))
    # the node's main raised the ConfigError at its first read, before it got any row
    assert isinstance(err, duotf.NodeFailedError), repr(err)
    assert err.remote_type.endswith("ConfigError"), err.remote_type
    message = str(err)
    assert ("get_data_feed(input_mapping=...): no column 'featurez' in the feed (its columns: "
            "'features', 'label'); did you mean 'features'?") in message, message
    assert took < 90, f"took {took:.0f} s"


@pytest.mark.engines("local", "procpool", "dask", "spark-local", "spark-standalone")
def test_mistake_input_mapping_of_existing_columns_still_selects(backend, engine):
    with duotf.run(mains.feed_columns_main, {"mapping": {"features": "x"}}, backend,
                   SPEC) as cluster:
        cluster.train(engine.frame(_frames()), epochs=1)
        results = cluster.wait(timeout=120)
    assert [r["columns"] for r in results] == [["x"], ["x"]]
    assert sum(r["rows"] for r in results) == 16
