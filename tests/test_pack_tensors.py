"""``duotf.spark.pack_tensors``: array columns packed in the JVM as raw values and their
shape, and what it refuses."""

from __future__ import annotations

import numpy as np
import pytest

from duotf.errors import ConfigError
from duotf._transport.columns import TENSOR_KEY, tensor_specs


def test_pack_tensors_stores_raw_values_and_their_shape(spark):
    from duotf.spark import pack_tensors

    rows = [([i + 0.5, i * 2.0, -float(i)], i) for i in range(50)]
    df = spark.createDataFrame(rows, "v array<double>, id long").repartition(3)
    packed = pack_tensors(df, "v", dtype="float64")
    assert packed.schema["v"].dataType.simpleString() == "binary"
    assert packed.schema["v"].metadata[TENSOR_KEY] == {"dtype": "float64", "shape": [3]}
    assert tensor_specs(packed.schema) == {"v": ("float64", (3,))}
    got = {r.id: np.frombuffer(r.v, np.float64).tolist() for r in packed.collect()}
    assert got == {i: v for v, i in rows}
    assert tensor_specs(packed.select("v").cache().schema) == {"v": ("float64", (3,))}


def test_pack_tensors_refuses_ragged_rows_and_other_types(spark):
    from duotf.spark import pack_tensors

    ragged = spark.createDataFrame([([1.0, 2.0],), ([1.0],)], "v array<double>").coalesce(1)
    with pytest.raises(Exception, match="column 'v' has a row of 1 values where the first row has 2"):
        pack_tensors(ragged, "v").collect()
    with pytest.raises(ConfigError, match="'s' is string; it must be an array of numbers"):
        pack_tensors(spark.createDataFrame([("a",)], "s string"), "s")
    with pytest.raises(ConfigError, match="no column 'w'"):
        pack_tensors(ragged, "w")
