"""duotf's JVM helper (``duotf.jvm``): numeric array columns packed in the JVM reach the feed as
the same arrays, refused with the same errors, and come back unchanged; the shipped jar is the
one its source builds.

The Spark tests take the shared suite's ``backend`` fixture, narrowed to its Spark kinds, so
the jar is loaded into the suite's own sessions (local: the driver's JVM runs the tasks;
standalone: the executors fetch it).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile

import numpy as np
import pytest

from duotf import jvm
from duotf.backends.spark_feed import arrow_source
from duotf.errors import FeedSchemaError
from duotf.feed.columns import from_arrow

TYPES = ["float", "double", "int", "bigint", "smallint", "tinyint"]


def test_the_shipped_jar_is_built_from_its_source(tmp_path):
    with zipfile.ZipFile(jvm.JAR) as z:
        assert z.read(jvm.DIGEST_ENTRY).decode() == jvm.source_digest(), \
            "duotf/jvm/duotf-jvm.jar is older than its source: run python -m duotf.jvm"
        shipped = sorted(n for n in z.namelist() if n.endswith(".class"))
    if shutil.which("javac") is None:
        pytest.skip("no JDK here: the source's digest is checked, not a rebuild")
    rebuilt = tmp_path / "rebuilt.jar"
    subprocess.run([sys.executable, "-m", "duotf.jvm", str(rebuilt)], check=True, timeout=120)
    with zipfile.ZipFile(rebuilt) as z:
        assert sorted(n for n in z.namelist() if n.endswith(".class")) == shipped


def _batches(df, specs):
    """Each partition's Arrow batches decoded as the feed decodes them."""
    return [from_arrow(b, specs) for b in df._collect_as_arrow()]


pytestmark_spark = pytest.mark.engines("spark-local", "spark-standalone")


@pytestmark_spark
def test_array_columns_of_every_number_type_reach_the_feed_as_the_same_arrays(backend, engine):
    from pyspark.sql import functions as F

    rows = [([i * 3 + k - 5 for k in range(3)], f"r{i}", i) for i in range(7)]
    base = engine.session.createDataFrame(rows, "a array<int>, s string, i int").coalesce(1)
    df = base.select(*[F.col("a").cast(f"array<{t}>").alias(f"a_{t}") for t in TYPES], "s", "i")
    packed, specs = arrow_source(df)
    assert {name for name, (_, shape) in specs.items() if shape is None} == {f"a_{t}" for t in TYPES}
    assert [f.dataType.simpleString() for f in packed.schema.fields[:len(TYPES)]] == ["binary"] * len(TYPES)
    got, = _batches(packed, specs)
    want, = _batches(df, {})
    assert set(got) == set(want)
    for name in want:
        if isinstance(want[name], np.ndarray):
            assert got[name].dtype == want[name].dtype, name
            np.testing.assert_array_equal(got[name], want[name])
        else:
            assert got[name] == want[name]
    # and back: unpacking gives the DataFrame's rows and schema
    back = jvm.unpack(packed, df.schema)
    assert back.schema.simpleString() == df.schema.simpleString()
    assert back.collect() == df.collect()


@pytestmark_spark
@pytest.mark.parametrize("rows, row, problem", [
    ([[1.0, 2.0], [3.0, None], [5.0, 6.0]], 1, "null"),  # a null element
    ([[1.0, 2.0], [3.0, 4.0], None], 2, "null"),  # a null row
    ([[1.0, 2.0], [3.0, 4.0], [5.0]], 2, "ragged"),
])
def test_packed_arrays_are_refused_as_spark_arrays_are(backend, engine, rows, row, problem):
    df = engine.session.createDataFrame([(r, i) for i, r in enumerate(rows)], "x array<float>, i int").coalesce(1)
    packed, specs = arrow_source(df)
    assert specs == {"x": ("float32", None)}
    errors = []
    for data, spec in [(packed, specs), (df, {})]:
        with pytest.raises(FeedSchemaError) as caught:
            _batches(data, spec)
        errors.append(caught.value)
    assert [(e.column, e.row, e.problem) for e in errors] == [("x", row, problem)] * 2
    assert str(errors[0]) == str(errors[1])


@pytestmark_spark
def test_packing_is_off_when_asked(backend, engine, monkeypatch):
    df = engine.session.createDataFrame([([1.0], 1)], "x array<float>, i int")
    monkeypatch.setenv("DUOTF_SPARK_PACK_ARRAYS", "0")
    assert arrow_source(df) == (df, {})
    monkeypatch.delenv("DUOTF_SPARK_PACK_ARRAYS")
    assert arrow_source(df)[1] == {"x": ("float32", None)}
