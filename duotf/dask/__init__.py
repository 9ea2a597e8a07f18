"""Scoring Dask DataFrames with a saved model in the Dask workers (no TF cluster), and the Dask
twin of the Spark ML stages: :class:`TFEstimator` (``fit(ddf)``) and :class:`TFModel`
(``predict(ddf)``, ``transform(ddf)``, ``to_local()``), with the parameter names of
:class:`duotf.spark.TFEstimator`; both are scikit-learn pipeline stages (``get_params``,
``set_params``, ``sklearn.base.clone``).

``import duotf.dask`` imports neither dask nor distributed; the functions import what they need.
"""

from __future__ import annotations

import json
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

import duotf._ml.estimator as core
from duotf._ml import scoring
from duotf.errors import ConfigError

__all__ = ["predict", "TFEstimator", "TFModel", "feed_stream"]


def _check_column(meta, name: str) -> None:
    import pandas as pd

    if name not in meta.columns:
        raise ConfigError(f"input column {name!r} is not in the DataFrame (its columns are "
                          f"{list(meta.columns)}): pass columns=[...] naming the model's input "
                          "columns", column=name)
    dtype = meta[name].dtype
    if isinstance(dtype, pd.ArrowDtype):
        import pyarrow as pa

        t = dtype.pyarrow_dtype
        if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
            t = t.value_type
        if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t):
            return
    elif dtype == object or getattr(dtype, "numpy_dtype", dtype).kind in "iufb":
        return  # object: lists or arrays a row (checked per partition, as the feed does)
    raise ConfigError(f"input column {name!r} is {dtype}; a model input takes numbers: give a "
                      "number column or a column of lists/arrays of numbers (strings read "
                      "with dask.config.set({'dataframe.convert-string': False}) stay lists)",
                      column=name, dtype=str(dtype))


def _types_of(meta) -> dict:
    """``{column: type name}`` from ``meta`` (a dict of dtypes or a frame of the output columns)."""
    import pandas as pd

    dtypes = dict(meta.dtypes) if hasattr(meta, "dtypes") else dict(meta)
    names = {"float64": "double", "float32": "float", "int64": "long", "int32": "int", "bool": "boolean"}
    types = {}
    for column, dtype in dtypes.items():
        if isinstance(dtype, pd.ArrowDtype) or str(dtype) == "object":
            types[column] = "array<float>"
        elif str(pd.api.types.pandas_dtype(dtype)) in names:
            types[column] = names[str(pd.api.types.pandas_dtype(dtype))]
        else:
            raise ConfigError(f"meta: column {column!r} has dtype {dtype}; a prediction column is "
                              f"one of {sorted(names)} or object/list (a vector)", column=column)
    return types


def predict(ddf, model, *, columns: Optional[Sequence[str]] = None,
            output: Union[str, Mapping[str, str]] = "prediction", meta=None,
            batch_size: int = scoring.DEFAULT_BATCH_SIZE):
    """``ddf`` with prediction columns added: lazy, one output partition per input partition,
    rows in their order, every column of ``ddf`` kept.

    Each partition is scored in the worker that computes it with the model from that
    process's cache (:func:`duotf._ml.scoring.get_model`: loaded once per worker process, reused by
    every task after). ``model``, ``columns``, ``output`` and ``batch_size`` are as for
    :func:`duotf.spark.predict`. A prediction of one value a row is a float64 column (int64 for
    an integer output), of several an Arrow-backed list column (``pd.ArrowDtype(pa.list_(
    pa.float32()))``, built from the predictions' buffer with no per-row work); ``meta`` (a
    dict ``{column: dtype}`` or an empty frame of the output columns) sets them otherwise, and
    is needed where the loader returns a plain callable. Array columns may hold lists or numpy
    arrays (object dtype) or be Arrow lists.

    Checked before anything runs, with ``ddf``'s meta and the model loaded once here, each a
    :class:`~duotf.ConfigError` naming the column or path: a missing input column or one that
    is not numbers, a model path that does not exist, output columns or dtypes that do not fit
    the model's outputs, an output column that exists already. A null, or an array column
    whose rows differ in length, fails the computation with a :class:`~duotf.FeedSchemaError`
    naming the column and the row.
    """
    import pandas as pd

    source = scoring.model_source(model)
    loaded = scoring.get_model(source)
    cols = scoring.input_columns(loaded, columns)
    frame_meta = ddf._meta
    for name in cols:
        _check_column(frame_meta, name)
    types = _types_of(meta) if meta is not None else None
    if types and isinstance(output, str) and len(types) > 1:
        output = {c: c for c in types}
    elif types and isinstance(output, str):
        types = {output: next(iter(types.values()))}
    outputs = scoring.output_columns(loaded, output, types)
    scoring.check_outputs(loaded, outputs, what="meta")
    for col in outputs:
        if col.column in frame_meta.columns:
            raise ConfigError(f"output column {col.column!r} is already a column of the DataFrame: "
                              "name the prediction otherwise (output=...)", column=col.column)
    plan = scoring.make_plan(source, loaded, cols, outputs, batch_size)
    out_meta = frame_meta.copy()
    for col in outputs:
        out_meta[col.column] = pd.Series([], dtype=scoring.pandas_dtype(col))
    return ddf.map_partitions(_score_partition, plan, meta=out_meta)


def _score_partition(frame, plan, partition_info=None):
    return scoring.score_pandas(plan, frame, (partition_info or {}).get("number"))


def _sklearn_tags(requires_fit: bool):
    """scikit-learn's ``Tags`` of a stage: called only by scikit-learn (``get_tags``, through
    ``__sklearn_tags__``), so scikit-learn is imported already; duotf never imports it itself.
    The label is a column of X (no target needed), and the stage transforms as it predicts."""
    from sklearn.utils import Tags, TargetTags, TransformerTags

    return Tags(estimator_type=None, target_tags=TargetTags(required=False),
                transformer_tags=TransformerTags(), no_validation=True, requires_fit=requires_fit)


# -- the Dask twin of the Spark ML stages ------------------------------------------------------------
class _Params:
    """scikit-learn's parameter protocol over a class's ``_PARAMS`` (its constructor's
    arguments, kept as attributes of the same names)."""

    _PARAMS: tuple = ()

    def get_params(self, deep: bool = True) -> Dict[str, Any]:
        """The constructor's parameters, by name (``deep``: scikit-learn's; no parameter here
        is itself an estimator)."""
        return {name: getattr(self, name) for name in self._PARAMS}

    def set_params(self, **params):
        """Set parameters by name; an unknown name is a ConfigError listing the known ones."""
        unknown = set(params) - set(self._PARAMS)
        if unknown:
            raise ConfigError(f"unknown parameter(s) {sorted(unknown)}: the parameters are "
                              f"{sorted(self._PARAMS)}", params=sorted(unknown))
        for name, value in params.items():
            setattr(self, name, value)
        return self


class TFEstimator(_Params):
    """Trains a TensorFlow model on a duotf cluster over a Dask DataFrame: the twin of
    :class:`duotf.spark.TFEstimator`, with the same parameters (see there), as keywords.

    ``fit(ddf)`` checks the columns before anything runs (a :class:`~duotf.ConfigError` names a
    missing column, a wrong dtype, a null, an array column whose rows differ in length: one pass
    over the data), runs the cluster on ``client`` (default: the current ``distributed``
    client) and returns a :class:`TFModel`. Feature columns hold numbers, or lists/arrays of
    numbers (object dtype) or Arrow lists.

    A scikit-learn (and dask-ml) pipeline stage, without importing scikit-learn: the
    constructor's arguments are attributes of the same names, ``get_params(deep=True)`` /
    ``set_params(**params)`` read and set them, and ``sklearn.base.clone`` makes an unfitted
    copy (:meth:`__sklearn_clone__`: the same ``client``, which cannot be deep-copied, and
    copies of the other parameters). ``fit(X, y=None)`` also keeps the fitted model as
    ``model_``, and :meth:`predict` / :meth:`transform` score with it: a ``Pipeline`` calls
    ``fit`` on its last step and then that step's ``predict``. ``fit`` returns the
    :class:`TFModel` (as the Spark twin's ``fit`` returns its model), not ``self``: a
    ``Pipeline``, ``GridSearchCV`` or ``cross_validate`` ignores the value.
    """

    #: the constructor's parameters, in its order: the fit's (FIT_PARAMS), the fitted model's
    #: columns, and the engine handle
    _OWN = ("predictionCol", "argmaxCol", "outputCols")
    _PARAMS = tuple(core.FIT_PARAMS) + _OWN + ("client",)

    def __init__(self, *, modelFn=None, trainFn=None, trainArgs=None, featuresCol="features",
                 labelCol="label", predictionCol="prediction", argmaxCol=None, outputCols=None,
                 numWorkers=1, numPs=0, epochs=1, batchSize=32, modelDir=None, env=None,
                 seed=None, verbose=0, client=None):
        # stored as given (sklearn's clone checks that get_params returns the very objects)
        self.modelFn, self.trainFn, self.trainArgs = modelFn, trainFn, trainArgs
        self.featuresCol, self.labelCol = featuresCol, labelCol
        self.predictionCol, self.argmaxCol, self.outputCols = predictionCol, argmaxCol, outputCols
        self.numWorkers, self.numPs, self.epochs, self.batchSize = numWorkers, numPs, epochs, batchSize
        self.modelDir, self.env, self.seed, self.verbose = modelDir, env, seed, verbose
        self.client = client

    def __sklearn_clone__(self) -> "TFEstimator":
        """An unfitted copy for ``sklearn.base.clone``: every parameter deep-copied as
        scikit-learn copies them, but ``client`` shared (a Client cannot be deep-copied)."""
        import copy

        return type(self)(**{name: value if name == "client" else copy.deepcopy(value)
                             for name, value in self.get_params(deep=False).items()})

    def __sklearn_is_fitted__(self) -> bool:
        return getattr(self, "model_", None) is not None

    def __sklearn_tags__(self):
        return _sklearn_tags(requires_fit=True)

    def __repr__(self) -> str:
        shown = {k: v for k, v in self.get_params().items()
                 if k != "client" and v is not None and not callable(v)}
        return f"duotf.dask.TFEstimator({', '.join(f'{k}={v!r}' for k, v in shown.items())})"

    def config(self) -> core.FitConfig:
        """The checked fit parameters (a ConfigError names a bad one)."""
        return core.FitConfig.from_params({k: getattr(self, k) for k in core.FIT_PARAMS})

    def fit(self, X, y=None) -> "TFModel":
        """Fit on the Dask DataFrame ``X`` (its ``featuresCol`` and ``labelCol`` columns; ``y``
        must be None, as a scikit-learn pipeline passes it: the label is a column of ``X``).
        Returns the fitted :class:`TFModel`, also kept as ``self.model_``."""
        import duotf.backends

        if y is not None:
            raise ConfigError("TFEstimator.fit(X, y): the label is a column of X (labelCol="
                              f"{self.labelCol!r}); pass y=None", param="labelCol")
        config = self.config()
        data = _fit_columns(X, config)
        client = self.client
        if client is None:
            from distributed import default_client

            try:
                client = default_client()
            except ValueError as exc:
                raise ConfigError("no Dask client: create one (distributed.Client(...)) or pass "
                                  "TFEstimator(client=...)") from exc
        backend = duotf.backends.resolve_backend(client)[0]
        result = core.fit(config, backend, id(client), data, feed_slots=0)
        model = TFModel(result.modelPath, featuresCol=config.featuresCol,
                        predictionCol=self.predictionCol, argmaxCol=self.argmaxCol,
                        outputCols=self.outputCols)
        model.history, model.results, model.fitSeconds = result.history, result.results, result.seconds
        self.model_ = model
        return model

    def _fitted(self) -> "TFModel":
        model = getattr(self, "model_", None)
        if model is None:
            raise ConfigError("this TFEstimator is not fitted yet: call fit(ddf) first (or score "
                              "with the TFModel that fit returned)")
        return model

    def predict(self, X):
        """``X`` scored by the fitted model (``self.model_``): :meth:`TFModel.predict`."""
        return self._fitted().predict(X)

    def transform(self, X):
        """``X`` scored by the fitted model (``self.model_``): :meth:`TFModel.transform`."""
        return self._fitted().transform(X)


def _fit_columns(ddf, config: core.FitConfig):
    """``ddf`` reduced to the fit's columns, checked: the meta's dtypes here, then one pass for
    rows, nulls and one length per array column."""
    import numpy as np

    if not hasattr(ddf, "map_partitions") or not hasattr(ddf, "columns"):
        raise ConfigError(f"TFEstimator.fit takes a Dask DataFrame, got {type(ddf).__name__}")
    meta = ddf._meta
    for name in config.columns:
        role = "featuresCol" if name in config.features else "labelCol"
        if name not in meta.columns:
            raise ConfigError(f"{'feature' if role == 'featuresCol' else 'label'} column {name!r} "
                              f"is not in the DataFrame (its columns are {list(meta.columns)}): set "
                              f"{role} to a column that is", column=name)
        _check_column(meta, name)
    data = ddf[config.columns]
    stats = data.map_partitions(_column_stats, meta={
        "column": object, "rows": np.int64, "nulls": np.int64, "strings": np.int64,
        "lo": np.int64, "hi": np.int64}).compute()
    rows = int(stats["rows"].sum()) // max(len(config.columns), 1)
    if rows < config.numWorkers:
        raise ConfigError(f"the DataFrame has {rows} rows, fewer than numWorkers="
                          f"{config.numWorkers}: every worker needs rows", rows=rows)
    for name in config.columns:
        mine = stats[stats["column"] == name]
        nulls = int(mine["nulls"].sum())
        if int(mine["strings"].sum()):
            raise ConfigError(f"column {name!r} holds strings, which a model cannot take: give "
                              "numbers or arrays of numbers (convert or index them first)",
                              column=name, problem="type")
        if nulls:
            raise ConfigError(f"column {name!r} holds {nulls} null(s): fill or drop them first, "
                              f"e.g. ddf.dropna(subset=[{name!r}])", column=name, problem="null")
        sized = mine[mine["hi"] >= 0]
        if len(sized) and (sized["lo"].min() != sized["hi"].max()):
            raise ConfigError(f"column {name!r} is ragged: its arrays hold from {sized['lo'].min()} "
                              f"to {sized['hi'].max()} values, and a model input takes one length: "
                              "pad or cut them to one length first", column=name, problem="ragged")
    return data


def _column_stats(frame):
    """Per column of a partition: rows, nulls, and the shortest and longest array (-1: not
    arrays)."""
    import numpy as np
    import pandas as pd

    out = []
    for name in frame.columns:
        col = frame[name]
        nulls = int(col.isna().sum()) if col.dtype != object else int(sum(v is None for v in col))
        lo = hi = -1
        strings = int(sum(isinstance(v, (str, bytes)) for v in col)) if col.dtype == object else 0
        if not strings and (col.dtype == object or isinstance(col.dtype, pd.ArrowDtype)):
            lengths = np.fromiter((len(v) for v in col if v is not None), dtype=np.int64)
            if len(lengths):
                lo, hi = int(lengths.min()), int(lengths.max())
        out.append((name, len(col), nulls, strings, lo, hi))
    return pd.DataFrame(out, columns=["column", "rows", "nulls", "strings", "lo", "hi"]).astype(
        {"rows": np.int64, "nulls": np.int64, "strings": np.int64, "lo": np.int64, "hi": np.int64})


class TFModel(_Params):
    """The fitted model of :class:`TFEstimator`, the twin of :class:`duotf.spark.TFModel`.

    ``predict(ddf)`` is lazy: one output partition per input partition, every column kept, the
    prediction columns added (``predictionCol``, or ``outputCols`` ``{column: output name}``,
    and ``argmaxCol`` when set), scored in the workers with the model loaded once per worker
    process and cached (:func:`predict`). ``to_local()`` is the plain Keras model; ``modelPath``
    the saved file; ``history`` the chief's Keras history. ``save(path)`` writes the parameters,
    the history and a copy of the model into a folder; :meth:`load` reads it back.

    ``transform(ddf)`` is ``predict(ddf)`` (the Spark twin's name). As a scikit-learn stage:
    ``get_params``/``set_params`` of the constructor's arguments, ``fit(X, y=None)`` learns
    nothing and returns the model itself (already fitted: a pipeline may hold it as its last
    step).
    """

    _PARAMS = ("modelPath", "featuresCol", "predictionCol", "argmaxCol", "outputCols", "batchSize")

    def __init__(self, modelPath: str, *, featuresCol="features", predictionCol="prediction",
                 argmaxCol=None, outputCols=None, batchSize=scoring.DEFAULT_BATCH_SIZE):
        self.modelPath = modelPath
        self.featuresCol = featuresCol
        self.predictionCol = predictionCol
        self.argmaxCol = argmaxCol
        self.outputCols = outputCols
        self.batchSize = batchSize
        self.history: Dict[str, List[float]] = {}
        self.results: List[Any] = []
        self.fitSeconds: Optional[float] = None

    def __repr__(self) -> str:
        return f"duotf.dask.TFModel({self.modelPath!r})"

    def __sklearn_is_fitted__(self) -> bool:
        return bool(self.modelPath)

    def __sklearn_tags__(self):
        return _sklearn_tags(requires_fit=False)

    def fit(self, X=None, y=None) -> "TFModel":
        """Nothing to learn: the model is fitted. Returns itself (a scikit-learn pipeline calls
        ``fit`` on its last step)."""
        return self

    def transform(self, ddf):
        """``ddf`` with the prediction columns added: :meth:`predict` (the Spark twin's
        ``transform``)."""
        return self.predict(ddf)

    def predict(self, ddf):
        import numpy as np

        names = list(core.feature_names(self.featuresCol))
        output = self.outputCols or self.predictionCol
        out = predict(ddf, self.modelPath, columns=names, output=output, batch_size=self.batchSize)
        if self.argmaxCol is None:
            return out
        if self.argmaxCol in out.columns:
            raise ConfigError(f"argmaxCol {self.argmaxCol!r} is already a column of the DataFrame: "
                              "name it otherwise", param="argmaxCol")
        source = output if isinstance(output, str) else next(iter(output))
        if out._meta[source].dtype != object and not hasattr(out._meta[source].dtype, "pyarrow_dtype"):
            raise ConfigError(f"argmaxCol={self.argmaxCol!r}: the model's output {source!r} is one "
                              "value a row; argmaxCol needs an output of several (a class's scores)",
                              param="argmaxCol")
        meta = out._meta.assign(**{self.argmaxCol: np.array([], dtype=np.float64)})
        return out.map_partitions(_argmax, source, self.argmaxCol, meta=meta)

    def to_local(self):
        """The fitted Keras model, loaded in this process."""
        import keras

        scoring.model_source(self.modelPath)  # a missing path is a ConfigError naming it
        return keras.saving.load_model(self.modelPath)

    _FIELDS = ("featuresCol", "predictionCol", "argmaxCol", "outputCols", "batchSize", "history",
               "fitSeconds")

    def save(self, path: str) -> None:
        """Write the model into the folder ``path`` (any fsspec URL): ``metadata.json`` and a
        copy of the saved model, so the folder is whole by itself."""
        from duotf.io.files import filesystem, open_url

        fs, fpath = filesystem(path)
        if fs.exists(fpath):
            raise ConfigError(f"{path!r} exists already: give a new folder", path=path)
        name = self.modelPath.rstrip("/").rsplit("/", 1)[-1]
        core.copy_model(self.modelPath, path.rstrip("/") + "/model/" + name)
        meta = {k: getattr(self, k) for k in self._FIELDS}
        meta["modelFile"] = name
        with open_url(path.rstrip("/") + "/metadata.json", "wb") as f:
            f.write(json.dumps(meta).encode())

    @classmethod
    def load(cls, path: str) -> "TFModel":
        from duotf.io.files import open_url

        with open_url(path.rstrip("/") + "/metadata.json") as f:
            meta = json.loads(f.read())
        model = cls(path.rstrip("/") + "/model/" + meta.pop("modelFile"),
                    **{k: meta[k] for k in ("featuresCol", "predictionCol", "argmaxCol",
                                            "outputCols", "batchSize")})
        model.history, model.fitSeconds = meta.get("history") or {}, meta.get("fitSeconds")
        return model


def _argmax(frame, source: str, column: str):
    import numpy as np

    import pandas as pd

    values = frame[source]
    out = frame.copy()
    if len(frame):
        if isinstance(values.dtype, pd.ArrowDtype):  # the predictions' one buffer, no per-row work
            flat = values.array.__arrow_array__().combine_chunks().flatten()
            scores = flat.to_numpy(zero_copy_only=False).reshape(len(frame), -1)
        else:
            scores = np.stack([np.asarray(v) for v in values])
        out[column] = np.argmax(scores, axis=1).astype(np.float64)
    else:
        out[column] = np.array([], dtype=np.float64)
    return out


def _empty_frame(frame):
    return frame.iloc[:0] if hasattr(frame, "iloc") else None


def feed_stream(cluster, futures, *, feed_timeout: float = 600.0, balance: bool = True,
                ragged: Sequence[str] = ()) -> dict:
    """Train ``cluster`` from a stream of Dask futures: each future's result (a pandas
    DataFrame, a partition computed on the workers) is fed as it completes, and the nodes'
    feed ends once ``futures`` (any iterable: a list, or a generator that yields futures as
    new data arrives) is exhausted and every future fed. Returns the counts.

    The futures done at the same moment are fed together as one chunk of an open feed
    (:meth:`duotf.Cluster.open_stream`), a Dask DataFrame of their results where they are (no
    row passes through the driver): the nodes read one continuous stream (``next_batch``
    across chunks; ``should_stop()`` and ``dataset()`` end with the stream), ``balance`` per
    chunk, schema checks as in ``cluster.train``. Each chunk returns once the nodes have its
    rows queued, so a slow node holds up the feeding of the next, never memory. A future that
    fails, a result that is not a DataFrame, or a chunk that fails ends every node's feed with
    the error and raises it (a :class:`~duotf.errors.FeedError`).
    """
    import threading

    import dask
    import dask.dataframe as dd
    from distributed import as_completed

    from duotf.errors import FeedError

    arrived = as_completed()  # the futures of the iterable, handed out as they complete
    cond = threading.Condition()
    state = {"added": 0, "end": False, "error": None}

    def watch():  # the iterable may block (a generator waiting for data): its own thread
        try:
            for future in futures:
                arrived.add(future)
                with cond:
                    state["added"] += 1
                    cond.notify_all()
        except BaseException as exc:
            state["error"] = exc
        finally:
            with cond:
                state["end"] = True
                cond.notify_all()

    stream = cluster.open_stream(feed_timeout=feed_timeout, balance=balance, ragged=ragged)
    watcher = threading.Thread(target=watch, name="duotf-dask-stream", daemon=True)
    watcher.start()
    taken = 0  # futures handed out by as_completed so far
    try:
        while True:
            try:
                ready = arrived.next_batch(block=True)  # every future done by now: one chunk
            except StopIteration:  # none left to wait for: more to come, or the end
                with cond:
                    cond.wait_for(lambda: state["end"] or state["added"] > taken)
                    if state["end"] and state["added"] == taken:
                        break
                continue
            taken += len(ready)
            for future in ready:
                if future.status != "finished":
                    error = future.exception() if future.status == "error" else None
                    raise FeedError(f"a future of the stream {future.status}: "
                                    f"{type(error).__name__ if error else ''} {error or future.key}"
                                    .strip(), cause=str(error) if error else None)
            meta = ready[0].client.submit(_empty_frame, ready[0]).result()
            if meta is None:
                raise FeedError(f"a future of the stream gave a "
                                f"{type(ready[0].result()).__name__}; feed_stream takes "
                                "futures of pandas DataFrames")
            with dask.config.set({"dataframe.convert-string": False}):
                chunk = dd.from_delayed(ready, meta=meta, verify_meta=False)
            stream.feed(chunk)
        if state["error"] is not None:
            raise FeedError(f"the stream's iterable of futures raised "
                            f"{type(state['error']).__name__}: {state['error']}") from state["error"]
        stream.end()
    except BaseException as exc:
        if stream.error is None:
            stream.fail(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
        raise
    finally:
        watcher.join(None if state["end"] else 0)
    return {**stream.report(), "futures": taken}
