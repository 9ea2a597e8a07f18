"""duotf's JVM side for Spark: a small jar (built from ``src/``, shipped in the package) that
moves numeric array columns out of the JVM as one memory copy a row.

Spark's Arrow writer converts an ``array<float>`` column one element at a time, which costs
the executors tens of microseconds of CPU a row and bounds the DataFrame feed at a fraction of
memory speed. :func:`pack` turns such columns into binary columns of their raw elements inside
the JVM (``duotf.jvm.ArrayPacking``), which Arrow copies as one buffer; the feed decodes them
back into the same arrays, with the same checks (:func:`duotf._transport.columns.decode_tensor`).
:func:`spill` goes further for a DataFrame of numbers trained on for several epochs: the JVM
writes each partition straight into the feed's frames, in a file on its executor, and counts its
rows (``duotf.jvm.FeedFrames``); no row then passes through Arrow or a Python worker.

One source, a jar per Spark line: Spark 4 splits the classic ``Dataset`` from the API's, and
Spark 3 is built with another Scala, so ``src/duotf/jvm/`` is compiled with ``src/spark3/`` into
``duotf-jvm-spark3.jar`` against Spark 3.5's jars, and with ``src/spark4/`` into
``duotf-jvm-spark4.jar`` against Spark 4's (each keeps the digest of its sources). The jar of
the running Spark's line is loaded into its SparkContext on first use: added to the driver's
class loader and shipped to the executors with ``addJar``. A Spark of no line here, a driver
whose class loader takes no jars, Spark Connect, or ``DUOTF_SPARK_PACK_ARRAYS=0``: the feed uses
Spark's Arrow writer, same data, slower; which one is chosen is logged once at DEBUG, and
nothing is tried that is not made for the running Spark.

On Spark Connect the jar could reach the server (``spark.addArtifacts`` adds it to the session's
class loader there and on the executors), but nothing in it would be worth calling: a Connect
client calls server-side Java only as a UDF of columns (``spark.udf.registerJavaFunction``), and
Spark hands a Java UDF each array as a Scala sequence of boxed numbers, so a packing UDF reads
every element as Spark's Arrow writer does and gains nothing; what :func:`pack` and
:func:`spill` do, a Dataset in and one built on its RDD out, has no Connect call. So a Connect
session feeds as classic Spark does with ``DUOTF_SPARK_PACK_ARRAYS=0`` (what that costs against
the jar: the benchmarks page, "duotf's jar on Spark Connect").

Rebuild the jars after changing a Java source: ``python -m duotf.backends.spark.jvm`` (a JDK, and
the jars of a pyspark of each line: see :func:`build`).
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from pathlib import Path
from typing import Dict, List, Optional, Tuple

logger = logging.getLogger(__name__)

HERE = Path(__file__).parent
#: the Spark lines a jar is built for: the line's name -> Spark's major version
LINES = {"spark3": 3, "spark4": 4}
CLASS = "duotf.jvm.ArrayPacking"
DIGEST_ENTRY = "duotf/jvm/SOURCE.sha256"  # the sources' digest, kept in the jar they were built into

#: Spark element types packed, with the numpy dtype the feed gives them (as Arrow gives them).
DTYPES = {"float": "float32", "double": "float64", "int": "int32", "bigint": "int64",
          "smallint": "int16", "tinyint": "int8"}

_lock = threading.Lock()


def enabled() -> bool:
    return os.environ.get("DUOTF_SPARK_PACK_ARRAYS", "1").strip().lower() not in ("0", "false", "no", "off")


def jar(line: str) -> Path:
    """The jar of a Spark line (``"spark3"``, ``"spark4"``)."""
    return HERE / f"duotf-jvm-{line}.jar"


def sources(line: str) -> List[Path]:
    """The Java sources of a line's jar: the shared ones and the line's own."""
    src = HERE / "src"
    return sorted((src / "duotf" / "jvm").glob("*.java")) + sorted((src / line / "duotf" / "jvm").glob("*.java"))


def line_of(version: str) -> Optional[str]:
    """The line whose jar serves Spark ``version`` (``"3.5.9"``, ``"4.3.0"``); None: no jar here
    serves it (Spark before 3.5)."""
    try:
        major, minor = (int(part) for part in version.split(".")[:2])
    except ValueError:
        return None
    if (major, minor) < (3, 5):
        return None
    return next((name for name, value in LINES.items() if value == major), None)


def source_digest(line: str) -> str:
    """The digest of the Java sources of a line's jar, by name and content."""
    digest = hashlib.sha256()
    for path in sources(line):
        digest.update(path.relative_to(HERE / "src").as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def load(sc) -> bool:
    """Whether duotf's JVM helper is usable in ``sc`` (loading its line's jar once per
    SparkContext). A Spark of no line here is never given a jar."""
    state = getattr(sc, "_duotf_jvm", None)
    if state is not None:
        return state
    with _lock:
        state = getattr(sc, "_duotf_jvm", None)
        if state is not None:
            return state
        line = line_of(str(sc.version))
        if line is None or not jar(line).exists():
            logger.debug("duotf: no JVM helper for Spark %s; array columns go through Spark's "
                         "Arrow writer", sc.version)
            sc._duotf_jvm = False
            return False
        try:
            path = str(jar(line))
            jvm = sc._jvm
            loader = jvm.java.lang.Thread.currentThread().getContextClassLoader()
            try:
                jvm.java.lang.Class.forName(CLASS, False, loader)
            except Exception:
                loader.addURL(jvm.java.io.File(path).toURI().toURL())
                jvm.java.lang.Class.forName(CLASS, False, loader)
            sc._jsc.addJar(path)
            state = True
            logger.debug("duotf: the JVM helper for Spark %s (%s) is loaded", sc.version, path)
        except Exception as exc:  # noqa: BLE001 - any JVM that cannot take it feeds through Arrow
            logger.info("duotf: the JVM helper did not load (%s); array columns go through "
                        "Spark's Arrow writer", str(exc).splitlines()[0] if str(exc) else exc)
            state = False
        sc._duotf_jvm = state
        return state


def packable(schema) -> Dict[str, str]:
    """``{column: numpy dtype}`` of the columns of a Spark schema that :func:`pack` packs: arrays
    of numbers (not tensor columns, which are binary already)."""
    from pyspark.sql import types as T

    out = {}
    for field in schema.fields:
        if isinstance(field.dataType, T.ArrayType):
            dtype = DTYPES.get(field.dataType.elementType.simpleString())
            if dtype:
                out[field.name] = dtype
    return out


def pack(df) -> Tuple[object, Dict[str, str]]:
    """``(df with its numeric array columns packed in the JVM, {column: dtype})``; ``(df, {})``
    where there is nothing to pack or the helper is not usable."""
    columns = packable(df.schema) if enabled() else {}
    if not columns:
        return df, {}
    session = df.sparkSession
    try:
        sc = session.sparkContext
    except Exception:  # noqa: BLE001 - Spark Connect: no JVM of ours to load into
        return df, {}
    if not load(sc):
        return df, {}
    from pyspark.sql import DataFrame

    try:
        # a plan of its own (select *): made now, under the settings of the job that reads
        # it, not the one Spark keeps for ``df`` if something ran ``df`` itself before
        jdf = session.sparkContext._jvm.duotf.jvm.ArrayPacking.pack(df.select("*")._jdf, list(columns))
    except Exception as exc:  # noqa: BLE001 - e.g. a Spark whose internals differ
        logger.info("duotf: the JVM helper could not pack %s (%s); they go through Spark's "
                    "Arrow writer", sorted(columns), str(exc).splitlines()[0] if str(exc) else exc)
        return df, {}
    return DataFrame(jdf, session), columns


def _tensors(schema) -> Dict[str, str]:
    """``{column: "<numpy type>|<item size>|<shape>"}`` of the tensor columns of a Spark schema
    (:func:`duotf.spark.pack_tensors`) whose type :func:`spill` writes (numbers)."""
    import numpy as np

    from duotf._transport.columns import tensor_specs

    out = {}
    for name, (dtype, shape) in tensor_specs(schema).items():
        try:
            dt = np.dtype(dtype)
        except TypeError:
            continue
        if dt.kind in "biuf":
            out[name] = f"{dt.str}|{dt.itemsize}|{','.join(str(int(d)) for d in shape)}"
    return out


def spillable(schema) -> bool:
    """Whether :func:`spill` writes every column of a Spark schema: numbers, arrays of numbers,
    and tensor columns of numbers (no strings, no other binary columns, no nested arrays)."""
    from pyspark.sql import types as T

    def number(t) -> bool:
        return t.simpleString() in DTYPES

    tensors = _tensors(schema)
    return bool(schema.fields) and all(
        number(f.dataType) or (isinstance(f.dataType, T.ArrayType) and number(f.dataType.elementType))
        or (isinstance(f.dataType, T.BinaryType) and f.name in tensors)
        for f in schema.fields)


def spill(df, cache_id: str, block_bytes: int, min_free_bytes: int, min_free_fraction: float,
          error_column: str):
    """``(index, kept)``: the DataFrame of ``df``'s partitions (its numbers, arrays of numbers
    and tensor columns) written from the JVM into feed frame files (``duotf.jvm.FeedFrames.spill``: one index row a partition, see
    ``duotf.backends.spark.feed``), and the JVM RDD that keeps that index on the executors
    (locally checkpointed: its first job writes the files; ``kept.unpersist(False)`` when they
    are gone). None where ``df`` has a column it does not write, or the helper is not usable."""
    if not enabled() or not spillable(df.schema):
        return None
    session = df.sparkSession
    try:
        sc = session.sparkContext
    except Exception:  # noqa: BLE001 - Spark Connect: no JVM of ours to load into
        return None
    if not load(sc):
        return None
    from pyspark.sql import DataFrame

    try:
        jdf, kept = sc._jvm.duotf.jvm.FeedFrames.spill(df.select("*")._jdf, cache_id, block_bytes,
                                                       min_free_bytes, float(min_free_fraction),
                                                       error_column, _tensors(df.schema))
    except Exception as exc:  # noqa: BLE001 - e.g. a Spark whose internals differ
        logger.info("duotf: the JVM helper could not write the feed's frames (%s); the first "
                    "epoch converts through Arrow", str(exc).splitlines()[0] if str(exc) else exc)
        return None
    return DataFrame(jdf, session), kept


def unpack(df, schema):
    """``df`` (a DataFrame whose columns are those of ``schema``, the packed ones binary) with its
    packed columns turned back into the arrays ``schema`` gives."""
    from pyspark.sql import DataFrame

    session = df.sparkSession
    return DataFrame(session.sparkContext._jvm.duotf.jvm.ArrayPacking.unpack(df._jdf, schema.json()),
                     session)


def answers_beside(source, keep: List[str], answers):
    """``source``'s columns ``keep`` beside ``answers``' columns, row by row within each
    partition (``duotf.jvm.Answers``), computed from ``source`` again each time it is read; None
    where that is not sound or not possible: ``source`` may not give the same rows in the same
    order again (a nondeterministic expression, or a shuffle whose output order may differ), it
    has another number of partitions than ``answers``, or the JVM helper is not usable. Call it
    before the answers are computed: the check plans ``answers`` but runs nothing."""
    from pyspark.sql import DataFrame

    try:
        sc = source.sparkSession.sparkContext
        if not enabled() or not load(sc):
            return None
        answers_jvm = sc._jvm.duotf.jvm.Answers
        if not answers_jvm.repeatable(source._jdf) or \
                answers_jvm.partitions(source._jdf) != answers_jvm.partitions(answers._jdf):
            return None
    except Exception as exc:  # noqa: BLE001 - Spark Connect, or a Spark whose internals differ
        logger.info("duotf: inference keeps the rows it answers (%s)",
                    str(exc).splitlines()[0] if str(exc) else exc)
        return None

    def pair(answered):
        return DataFrame(answers_jvm.beside(source._jdf, list(keep), answered._jdf), source.sparkSession)

    return pair


def build(line: Optional[str] = None, spark_jars: Optional[Path] = None,
          into: Optional[Path] = None) -> Path:
    """Compile a line's jar from its sources against ``spark_jars`` (a folder of Spark's jars of
    that line; default: the installed pyspark's, whose line is the default ``line``) into
    ``into`` (default: the package's own jar of that line). Needs a JDK's ``javac``."""
    import shutil
    import subprocess
    import tempfile
    import zipfile

    if spark_jars is None:
        import pyspark

        spark_jars = Path(pyspark.__file__).parent / "jars"
        line = line or line_of(pyspark.__version__)
    if line not in LINES:
        raise ValueError(f"no duotf jar for Spark line {line!r}: the lines are {sorted(LINES)}")
    target = into or jar(line)
    javac = shutil.which("javac")
    if not javac:
        raise RuntimeError("building duotf's jar needs a JDK (javac on PATH)")
    with tempfile.TemporaryDirectory(prefix="duotf-jvm-") as out:
        subprocess.run([javac, "--release", "17", "-nowarn", "-cp", str(Path(spark_jars) / "*"),
                        "-d", out, *map(str, sources(line))], check=True)
        classes: List[Path] = sorted(Path(out).rglob("*.class"))
        with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as z:
            for path in classes:
                info = zipfile.ZipInfo(str(path.relative_to(out)), date_time=(2026, 1, 1, 0, 0, 0))
                z.writestr(info, path.read_bytes(), zipfile.ZIP_DEFLATED)
            z.writestr(zipfile.ZipInfo(DIGEST_ENTRY, date_time=(2026, 1, 1, 0, 0, 0)), source_digest(line))
    return target


def stale() -> List[str]:
    """The lines whose shipped jar is missing or was not built from the current sources."""
    import zipfile

    found = []
    for line in LINES:
        try:
            with zipfile.ZipFile(jar(line)) as z:
                if z.read(DIGEST_ENTRY).decode() != source_digest(line):
                    found.append(line)
        except (OSError, KeyError, zipfile.BadZipFile):
            found.append(line)
    return found
