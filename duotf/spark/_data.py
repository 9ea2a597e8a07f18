"""The data of a Spark fit, before it is fed: the fit's columns (ML vectors as arrays), the
validation rows split off and collected, and the checks that name a column the feed cannot take
(nulls, ragged arrays, too few rows). Used by :mod:`duotf.spark._ml`'s TFEstimator."""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import duotf._ml.estimator as core
from duotf.backends.spark.client import collect_arrow
from duotf.errors import ConfigError

#: the Spark types of a column the feed takes as numbers (and arrays of them)
_NUMBERS = ("tinyint", "smallint", "int", "bigint", "float", "double", "boolean")


def is_vector(data_type) -> bool:
    """Whether ``data_type`` is pyspark.ml's vector type (fed as ``array<float>``)."""
    return type(data_type).__name__ == "VectorUDT"


def _role(name: str, config: core.FitConfig) -> str:
    return ("featuresCol" if name in config.features else "labelCol" if name in config.labels
            else "weightCol")


def prepare_columns(df, config: core.FitConfig) -> object:
    """``df`` reduced to the fit's columns, ML vectors as ``array<float>``, and the boolean
    column of the validation split last (``validationIndicatorCol``, or
    ``validationFraction``'s seeded hash of the fed values); a missing column or one of a
    type the feed cannot take is a ConfigError naming it and its parameter."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    from duotf._transport.columns import tensor_specs

    tensors = tensor_specs(df.schema)
    selected = []
    for name in config.columns:
        param = _role(name, config)
        if name not in df.columns:
            role = {"featuresCol": "feature", "labelCol": "label", "weightCol": "weight"}[param]
            raise ConfigError(f"{role} column {name!r} is not in the DataFrame (its columns are "
                              f"{df.columns}): set {param} to a column that is", column=name,
                              param=param)
        dt = df.schema[name].dataType
        if param == "weightCol" and dt.simpleString() not in _NUMBERS:
            raise ConfigError(f"weightCol={name!r} is {dt.simpleString()}: give a column of one "
                              "number a row", column=name, param=param, type=dt.simpleString())
        if is_vector(dt):
            from pyspark.ml.functions import vector_to_array

            selected.append(vector_to_array(F.col(name), "float32").alias(name))
            continue
        ok = (dt.simpleString() in _NUMBERS or name in tensors
              or (isinstance(dt, T.ArrayType) and dt.elementType.simpleString() in _NUMBERS))
        if not ok:
            hint = ("pack it with duotf.spark.pack_tensors, or give an array<float> column"
                    if isinstance(dt, T.BinaryType) else
                    "give a number, array<number> or ML vector column (strings: index them first, "
                    "e.g. pyspark.ml.feature.StringIndexer)")
            raise ConfigError(f"column {name!r} is {dt.simpleString()}, which a model cannot take: "
                              f"{hint}", column=name, type=dt.simpleString())
        selected.append(F.col(name))
    indicator = config.validationIndicatorCol
    if indicator is not None:
        if indicator not in df.columns:
            raise ConfigError(f"validationIndicatorCol={indicator!r} is not a column of the "
                              f"DataFrame (its columns are {df.columns})", column=indicator,
                              param="validationIndicatorCol")
        kind = df.schema[indicator].dataType.simpleString()
        if kind != "boolean":
            raise ConfigError(f"validationIndicatorCol={indicator!r} is {kind}: give a boolean "
                              "column (True: a validation row)", column=indicator,
                              param="validationIndicatorCol", type=kind)
        selected.append(F.col(indicator))
    data = df.select(*selected)
    if config.validationFraction > 0:
        hashed = F.xxhash64(*[F.col(f"`{n}`") for n in config.columns], F.lit(config.split_seed))
        data = data.withColumn(core.VALIDATION_FLAG, F.pmod(hashed, F.lit(1 << 24))
                               < F.lit(config.hash_threshold))
    return data


def split_validation(data, config: core.FitConfig) -> Tuple[Any, Optional[Dict[str, Any]]]:
    """``(training rows, validation rows)`` of ``data`` (:func:`prepare_columns`'s): the
    validation rows collected to the driver as ``{column: array}`` (None without validation)."""
    from pyspark.sql import functions as F

    from duotf._transport.columns import from_arrow, tensor_specs

    flag = config.split_column
    if flag is None:
        return data, None
    train = data.filter(~F.col(f"`{flag}`")).drop(flag)
    held = data.filter(F.col(f"`{flag}`")).drop(flag)
    table = collect_arrow(held).combine_chunks()
    if not table.num_rows:  # counted before: the DataFrame changed since
        raise ConfigError(f"{flag!r} marks no row of the DataFrame as a validation row now",
                          param="validationIndicatorCol" if config.validationIndicatorCol
                          else "validationFraction")
    return train, from_arrow(table.to_batches()[0], tensor_specs(held.schema))


def check_rows(df, config: core.FitConfig) -> None:
    """One aggregation job over the fit's columns: enough rows, no nulls, and every array
    column of one length; a ConfigError names the column otherwise."""
    enough_rows(column_checks(df, config.split_column), config)


def enough_rows(rows: Tuple[int, int], config: core.FitConfig) -> None:
    """``rows``: all of them, and the validation rows of those."""
    total, held = rows
    if config.validating:
        core.validation_rows(config, held, total)
    elif total < config.numWorkers:
        raise ConfigError(f"the DataFrame has {total} rows, fewer than numWorkers="
                          f"{config.numWorkers}: every worker needs rows", rows=total)


def column_checks(df, flag: Optional[str] = None) -> Tuple[int, int]:
    """One aggregation job over ``df``'s columns: no nulls, every array column of one length
    (a ConfigError names the column otherwise); returns the number of rows, and of those
    whose boolean column ``flag`` is True."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    aggs = [F.count(F.lit(1)).alias("rows")]
    if flag is not None:
        aggs.append(F.sum(F.col(f"`{flag}`").cast("long")).alias("held"))
    arrays = [f.name for f in df.schema.fields if isinstance(f.dataType, T.ArrayType)]
    for i, f in enumerate(df.schema.fields):
        col = F.col(f"`{f.name}`")
        null = col.isNull()
        if f.name in arrays:
            null = null | F.coalesce(F.exists(col, lambda x: x.isNull()), F.lit(False))
        aggs.append(F.sum(null.cast("long")).alias(f"n{i}"))
        if f.name in arrays:
            aggs += [F.min(F.size(col)).alias(f"lo{i}"), F.max(F.size(col)).alias(f"hi{i}")]
    row = df.agg(*aggs).collect()[0].asDict()
    for i, f in enumerate(df.schema.fields):
        if row[f"n{i}"]:
            raise ConfigError(f"column {f.name!r} holds {row[f'n{i}']} null(s) (or arrays with "
                              f"null values): fill or drop them first, e.g. df.dropna(subset="
                              f"[{f.name!r}])", column=f.name, problem="null")
        if f.name in arrays and row[f"lo{i}"] != row[f"hi{i}"]:
            raise ConfigError(f"column {f.name!r} is ragged: its arrays hold from {row[f'lo{i}']} "
                              f"to {row[f'hi{i}']} values, and a model input takes one length: "
                              "pad or cut them to one length first", column=f.name, problem="ragged")
    return row["rows"], int(row.get("held") or 0)
