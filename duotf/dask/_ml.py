"""The Dask twin of the Spark ML stages: :class:`TFEstimator` (``fit(ddf)``) and :class:`TFModel`
(``predict(ddf)``, ``transform(ddf)``, ``to_local()``), re-exported by :mod:`duotf.dask`.

Their parameters are those of :class:`duotf.spark.TFEstimator` in the spelling of the Dask
ecosystem (scikit-learn, dask-ml, ``xgboost.dask``): ``model_fn``, ``features_col``,
``num_workers``, ... The engine-neutral core (:mod:`duotf._ml.estimator`) keeps Spark ML's
names; :data:`SPARK_NAMES` is the one table that translates between them, here at the boundary:
the parameters handed to the core, the core's errors (their messages and ``param``), and the
camelCase keys of a :class:`TFModel` saved by an earlier duotf. A camelCase keyword is refused
with a ``TypeError`` naming the snake_case spelling.

Both are scikit-learn pipeline stages (``get_params``, ``set_params``, ``sklearn.base.clone``)
without importing scikit-learn.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any, Dict, List, Optional, TypeVar

import duotf._ml.estimator as core
from duotf._names import public
from duotf._ml import mapping, scoring
from duotf.dask._scoring import check_column, predict_outputs
from duotf.errors import ConfigError

if TYPE_CHECKING:  # dask, distributed and Keras are imported where they are used
    import dask.dataframe as dd
    import keras
    from distributed import Client

__all__ = ["TFEstimator", "TFModel", "SPARK_NAMES", "FIT_PARAMS"]

#: the Dask twin's names -> Spark ML's (duotf.spark's Params, the core's FIT_PARAMS and
#: FitConfig, a TFModel's metadata.json before the Dask twin spoke snake_case)
SPARK_NAMES: Dict[str, str] = {
    "model_fn": "modelFn", "train_fn": "trainFn", "train_args": "trainArgs",
    "features_col": "featuresCol", "label_col": "labelCol", "num_workers": "numWorkers",
    "num_ps": "numPs", "epochs": "epochs", "batch_size": "batchSize", "model_dir": "modelDir",
    "env": "env", "seed": "seed", "verbose": "verbose",
    "validation_indicator_col": "validationIndicatorCol", "validation_fraction": "validationFraction",
    "weight_col": "weightCol", "callbacks": "callbacks", "shuffle": "shuffle",
    "run_id": "runId", "mlflow_logging": "mlflowLogging",
    "prediction_col": "predictionCol", "argmax_col": "argmaxCol", "output_cols": "outputCols",
    "model_path": "modelPath", "fit_seconds": "fitSeconds", "model_file": "modelFile",
    "signature_def_key": "signatureDefKey", "tag_set": "tagSet", "input_mapping": "inputMapping",
    "output_mapping": "outputMapping", "probability_col": "probabilityCol",
    "raw_prediction_col": "rawPredictionCol",
}
_DASK_NAMES = {camel: snake for snake, camel in SPARK_NAMES.items()}
#: the fit's parameters (the core's FIT_PARAMS), in the Dask spelling and the core's order
FIT_PARAMS = tuple(_DASK_NAMES[name] for name in core.FIT_PARAMS)
_CAMEL = re.compile(r"\b(" + "|".join(c for c, s in _DASK_NAMES.items() if c != s) + r")\b")


def _respelled(exc: ConfigError) -> ConfigError:
    """The core's ConfigError with the parameters it names in the Dask spelling."""
    attrs = exc.attributes
    if attrs.get("param") in _DASK_NAMES:
        attrs["param"] = _DASK_NAMES[attrs["param"]]
    return type(exc)(_CAMEL.sub(lambda m: _DASK_NAMES[m.group(1)], exc.message), **attrs)


def _refuse_camel(what: str, given: Dict[str, Any], known) -> None:
    """A keyword ``what`` does not take: a TypeError, naming the snake_case spelling of a
    camelCase (Spark ML) name."""
    for name in given:
        snake = _DASK_NAMES.get(name)
        hint = (f": the Dask twin spells it {snake}= (camelCase is duotf.spark's spelling)"
                if snake in known else "")
        raise TypeError(f"{what}() got an unexpected keyword argument {name!r}{hint}")


def _sklearn_tags(requires_fit: bool):
    """scikit-learn's ``Tags`` of a stage: called only by scikit-learn (``get_tags``, through
    ``__sklearn_tags__``), so scikit-learn is imported already; duotf never imports it itself.
    The label is a column of X (no target needed), and the stage transforms as it predicts."""
    from sklearn.utils import Tags, TargetTags, TransformerTags

    return Tags(estimator_type=None, target_tags=TargetTags(required=False),
                transformer_tags=TransformerTags(), no_validation=True, requires_fit=requires_fit)


_P = TypeVar("_P", bound="_Params")


class _Params:
    """scikit-learn's parameter protocol over a class's ``_PARAMS`` (its constructor's
    arguments, kept as attributes of the same names)."""

    _PARAMS: tuple = ()

    def get_params(self, deep: bool = True) -> Dict[str, Any]:
        """The constructor's parameters, by name (``deep``: scikit-learn's; no parameter here
        is itself an estimator)."""
        return {name: getattr(self, name) for name in self._PARAMS}

    def set_params(self: _P, **params: Any) -> _P:
        """Set parameters by name; an unknown name is a ConfigError listing the known ones (a
        camelCase name, naming its snake_case spelling)."""
        unknown = set(params) - set(self._PARAMS)
        if unknown:
            hints = [f"{name} is spelled {_DASK_NAMES[name]}" for name in sorted(unknown)
                     if _DASK_NAMES.get(name) in self._PARAMS]
            raise ConfigError(f"unknown parameter(s) {sorted(unknown)}: the parameters are "
                              f"{sorted(self._PARAMS)}" + (f" ({'; '.join(hints)})" if hints else ""),
                              params=sorted(unknown))
        for name, value in params.items():
            setattr(self, name, value)
        return self


@public("duotf.dask")
class TFEstimator(_Params):
    """Trains a TensorFlow model on a duotf cluster over a Dask DataFrame: the twin of
    :class:`duotf.spark.TFEstimator`, with its parameters in snake_case (``model_fn``,
    ``train_fn``, ``train_args``, ``features_col``, ``label_col``, ``prediction_col``,
    ``argmax_col``, ``output_cols``, ``num_workers``, ``num_ps``, ``epochs``, ``batch_size``,
    ``model_dir``, ``env``, ``seed``, ``verbose``, ``validation_indicator_col``,
    ``validation_fraction``, ``weight_col``, ``callbacks``, ``shuffle``, ``run_id``,
    ``mlflow_logging``; see there), as keywords, and ``client``. Give ``run_id`` to one fit
    only: not to an estimator that a search (``GridSearchCV``, ``cross_validate``) clones, whose fits would share its
    folder (a clone of other parameters is refused; one of the same parameters on other rows
    is not told apart). The validation rows are computed into the driver (bounded as on Spark);
    ``validation_fraction`` hashes each row with pandas' row hash, seeded with ``seed``.

    ``fit(ddf)`` checks the columns before anything runs (a :class:`~duotf.ConfigError` names a
    missing column, a wrong dtype, a null, an array column whose rows differ in length: one pass
    over the data), runs the cluster on ``client`` (default: the current ``distributed``
    client) and returns a :class:`TFModel`. Feature columns hold numbers, or lists/arrays of
    numbers (object dtype) or Arrow lists. A ``train_fn`` gets the core's ``args`` as on Spark
    (``args["modelPath"]``, ``args["batchSize"]``, ``args["args"]``: its ``train_args``).

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
    _OWN = ("prediction_col", "argmax_col", "output_cols")
    _PARAMS = FIT_PARAMS + _OWN + ("client",)

    def __init__(self, *, model_fn: Optional[core.ModelFn] = None,
                 train_fn: Optional[core.TrainFn] = None, train_args: Any = None,
                 features_col: core.ColumnNames = "features",
                 label_col: Optional[core.ColumnNames] = "label", prediction_col: str = "prediction",
                 argmax_col: Optional[str] = None, output_cols: Optional[Dict[str, str]] = None,
                 num_workers: int = 1, num_ps: int = 0, epochs: int = 1, batch_size: int = 32,
                 model_dir: Optional[str] = None, env: Optional[Dict[str, str]] = None,
                 seed: Optional[int] = None, verbose: int = 0,
                 validation_indicator_col: Optional[str] = None, validation_fraction: float = 0.0,
                 weight_col: Optional[str] = None, callbacks: Optional[core.Callbacks] = None,
                 shuffle: bool = False, run_id: Optional[str] = None,
                 mlflow_logging: bool = True,
                 client: Optional[Client] = None, **spark_names: Any):
        _refuse_camel("TFEstimator", spark_names, self._PARAMS)
        # stored as given (sklearn's clone checks that get_params returns the very objects)
        self.model_fn, self.train_fn, self.train_args = model_fn, train_fn, train_args
        self.features_col, self.label_col = features_col, label_col
        self.prediction_col, self.argmax_col, self.output_cols = prediction_col, argmax_col, output_cols
        self.num_workers, self.num_ps, self.epochs, self.batch_size = num_workers, num_ps, epochs, batch_size
        self.model_dir, self.env, self.seed, self.verbose = model_dir, env, seed, verbose
        self.validation_indicator_col, self.validation_fraction = validation_indicator_col, validation_fraction
        self.weight_col, self.callbacks, self.shuffle = weight_col, callbacks, shuffle
        self.run_id = run_id
        self.mlflow_logging = mlflow_logging
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
        """The checked fit parameters, in the core's names (a ConfigError names a bad one in
        the Dask spelling)."""
        try:
            return core.FitConfig.from_params({SPARK_NAMES[k]: getattr(self, k) for k in FIT_PARAMS})
        except ConfigError as exc:
            raise _respelled(exc) from None

    def fit(self, X: dd.DataFrame, y: None = None) -> "TFModel":
        """Fit on the Dask DataFrame ``X`` (its ``features_col`` and ``label_col`` columns; ``y``
        must be None, as a scikit-learn pipeline passes it: the label is a column of ``X``).
        Returns the fitted :class:`TFModel`, also kept as ``self.model_``."""
        import duotf.backends

        if y is not None:
            raise ConfigError("TFEstimator.fit(X, y): the label is a column of X (label_col="
                              f"{self.label_col!r}); pass y=None", param="label_col")
        config = self.config()
        try:
            data, validation = _split(_fit_columns(X, config), config)
        except ConfigError as exc:
            raise _respelled(exc) from None
        client = self.client
        if client is None:
            from distributed import default_client

            try:
                client = default_client()
            except ValueError as exc:
                raise ConfigError("no Dask client: create one (distributed.Client(...)) or pass "
                                  "TFEstimator(client=...)") from exc
        backend = duotf.backends.resolve_backend(client)[0]
        try:
            result = core.fit(config, backend, id(client), data, feed_slots=0, validation=validation)
        except ConfigError as exc:
            if exc.attributes.get("param") != "runId":
                raise
            raise _respelled(exc) from None  # run_id's checks, in the Dask spelling
        model = TFModel(result.modelPath, features_col=config.featuresCol,
                        prediction_col=self.prediction_col, argmax_col=self.argmax_col,
                        output_cols=self.output_cols)
        model.history, model.results, model.fit_seconds = result.history, result.results, result.seconds
        model.initial_epoch = result.initialEpoch
        self.model_ = model
        return model

    def _fitted(self) -> "TFModel":
        model = getattr(self, "model_", None)
        if model is None:
            raise ConfigError("this TFEstimator is not fitted yet: call fit(ddf) first (or score "
                              "with the TFModel that fit returned)")
        return model

    def predict(self, X: dd.DataFrame) -> dd.DataFrame:
        """``X`` scored by the fitted model (``self.model_``): :meth:`TFModel.predict`."""
        return self._fitted().predict(X)

    def transform(self, X: dd.DataFrame) -> dd.DataFrame:
        """``X`` scored by the fitted model (``self.model_``): :meth:`TFModel.transform`."""
        return self._fitted().transform(X)


def _fit_columns(ddf, config: core.FitConfig):
    """``ddf`` reduced to the fit's columns and the boolean column of the validation split
    (``validation_indicator_col``, or ``validation_fraction``'s seeded hash of the fed values),
    checked: the meta's dtypes here, then one pass for rows, nulls, one length per array
    column and the validation rows (:func:`duotf._ml.estimator.validation_rows`)."""
    import dask
    import numpy as np
    import pandas as pd

    if not hasattr(ddf, "map_partitions") or not hasattr(ddf, "columns"):
        raise ConfigError(f"TFEstimator.fit takes a Dask DataFrame, got {type(ddf).__name__}")
    meta = ddf._meta
    for name in config.columns:
        role = ("features_col" if name in config.features else "label_col" if name in config.labels
                else "weight_col")
        if name not in meta.columns:
            kind = {"features_col": "feature", "label_col": "label", "weight_col": "weight"}[role]
            raise ConfigError(f"{kind} column {name!r} is not "
                              f"in the DataFrame (its columns are {list(meta.columns)}): set "
                              f"{role} to a column that is", column=name, param=role)
        # the weights first: a string column is named by its parameter, as on Spark
        if role == "weight_col" and not pd.api.types.is_numeric_dtype(meta[name].dtype):
            raise ConfigError(f"weight_col={name!r} is {meta[name].dtype}: give a column of one "
                              "number a row", column=name, param=role)
        check_column(meta, name)
    indicator = config.validationIndicatorCol
    if indicator is not None and indicator not in meta.columns:
        raise ConfigError(f"validation_indicator_col={indicator!r} is not a column of the "
                          f"DataFrame (its columns are {list(meta.columns)})", column=indicator,
                          param="validation_indicator_col")
    if indicator is not None and not pd.api.types.is_bool_dtype(meta[indicator].dtype):
        raise ConfigError(f"validation_indicator_col={indicator!r} is {meta[indicator].dtype}: "
                          "give a boolean column (True: a validation row)", column=indicator,
                          param="validation_indicator_col")
    # Dask before dask-expr (2024.1) made each step's object columns strings, arrays among them
    # ("dataframe.convert-string"): the fit's columns stay as the user's DataFrame holds them
    with dask.config.set({"dataframe.convert-string": False}):
        data = ddf[config.columns + ([indicator] if indicator is not None else [])]
        if config.validationFraction > 0:
            flags = data.map_partitions(_hash_flags, config.columns, config.split_seed,
                                        config.hash_threshold, meta=(core.VALIDATION_FLAG, bool))
            data = data.assign(**{core.VALIDATION_FLAG: flags})
        stats = data.map_partitions(_column_stats, meta={
            "column": object, "rows": np.int64, "nulls": np.int64, "strings": np.int64,
            "lo": np.int64, "hi": np.int64, "trues": np.int64}).compute()
    rows = int(stats["rows"].sum()) // max(len(data.columns), 1)
    for name in data.columns:
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
    if config.validating:
        held = int(stats[stats["column"] == config.split_column]["trues"].sum())
        core.validation_rows(config, held, rows)
    elif rows < config.numWorkers:
        raise ConfigError(f"the DataFrame has {rows} rows, fewer than num_workers="
                          f"{config.numWorkers}: every worker needs rows", rows=rows)
    return data


def _split(data, config: core.FitConfig) -> tuple:
    """``(training rows, validation rows)`` of :func:`_fit_columns`'s frame: the validation
    rows computed into the driver as ``{column: array}`` (None without validation)."""
    import dask

    from duotf._transport.columns import from_pandas

    flag = config.split_column
    if flag is None:
        return data, None
    with dask.config.set({"dataframe.convert-string": False}):  # (see _fit_columns)
        train = data[~data[flag]].drop(columns=[flag])
        held = data[data[flag]].drop(columns=[flag]).compute().reset_index(drop=True)
    return train, core.check_validation_data(config, from_pandas(held))


def _hash_flags(frame, columns: List[str], seed: int, threshold: int):
    """``validation_fraction``'s split of a partition: a seeded hash of each row's fed values
    (arrays by their bytes), True for a validation row; the same rows give the same split
    whatever the partitioning."""
    import numpy as np
    import pandas as pd

    values = {}
    for name in columns:
        col = frame[name]
        if col.dtype == object or not pd.api.types.is_numeric_dtype(col.dtype):
            col = col.map(lambda v: np.asarray(v).tobytes().hex())
        values[name] = col
    hashed = pd.util.hash_pandas_object(pd.DataFrame(values, index=frame.index), index=False,
                                        hash_key=f"{seed:016d}"[-16:])
    return pd.Series(hashed.to_numpy() % (1 << 24) < threshold, index=frame.index,
                     name=core.VALIDATION_FLAG)


def _column_stats(frame):
    """Per column of a partition: rows, nulls, the shortest and longest array (-1: not
    arrays), and the True values of a boolean column."""
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
        trues = int(col.fillna(False).sum()) if pd.api.types.is_bool_dtype(col.dtype) else 0
        out.append((name, len(col), nulls, strings, lo, hi, trues))
    return pd.DataFrame(out, columns=["column", "rows", "nulls", "strings", "lo", "hi", "trues"]).astype(
        {"rows": np.int64, "nulls": np.int64, "strings": np.int64, "lo": np.int64, "hi": np.int64,
         "trues": np.int64})


@public("duotf.dask")
class TFModel(_Params):
    """The fitted model of :class:`TFEstimator`, the twin of :class:`duotf.spark.TFModel`.

    ``predict(ddf)`` is lazy: one output partition per input partition, every column kept, the
    prediction columns added (``prediction_col``, or ``output_cols`` ``{column: output name}``,
    and ``argmax_col`` when set), scored in the workers with the model loaded once per worker
    process and cached (:func:`duotf.dask.predict`). ``to_local()`` is the plain Keras model;
    ``model_path`` the saved file; ``history`` the chief's Keras history; ``fit_seconds`` how
    long the fit took. ``save(path)`` writes the parameters, the history and a copy of the
    model into a folder; :meth:`load` reads it back (also a folder an earlier duotf saved, with
    camelCase keys).

    The Spark twin's choice of what scores, in snake_case: ``signature_def_key``, ``tag_set``,
    ``input_mapping`` (``{column: signature input name}``), ``output_mapping`` (``{signature
    output name: column}``), and a classifier's ``probability_col`` and ``raw_prediction_col``
    (Arrow-backed lists of float64; ``prediction_col`` is then the class): see
    :class:`duotf.spark.TFModel`.

    ``transform(ddf)`` is ``predict(ddf)`` (the Spark twin's name). As a scikit-learn stage:
    ``get_params``/``set_params`` of the constructor's arguments, ``fit(X, y=None)`` learns
    nothing and returns the model itself (already fitted: a pipeline may hold it as its last
    step).
    """

    _PARAMS = ("model_path", "features_col", "prediction_col", "argmax_col", "output_cols",
               "batch_size", "signature_def_key", "tag_set", "input_mapping", "output_mapping",
               "probability_col", "raw_prediction_col")

    def __init__(self, model_path: Optional[str] = None, *, features_col: core.ColumnNames = "features",
                 prediction_col: str = "prediction", argmax_col: Optional[str] = None,
                 output_cols: Optional[Dict[str, str]] = None,
                 batch_size: int = scoring.DEFAULT_BATCH_SIZE,
                 signature_def_key: str = scoring.DEFAULT_SIGNATURE, tag_set: str = "serve",
                 input_mapping: Optional[Dict[str, str]] = None,
                 output_mapping: Optional[Dict[str, str]] = None, probability_col: str = "",
                 raw_prediction_col: str = "", **spark_names: Any):
        _refuse_camel("TFModel", spark_names, self._PARAMS)
        if model_path is None:
            raise TypeError("TFModel() missing the argument 'model_path': the saved model's path")
        self.model_path = model_path
        self.features_col = features_col
        self.prediction_col = prediction_col
        self.argmax_col = argmax_col
        self.output_cols = output_cols
        self.batch_size = batch_size
        self.signature_def_key, self.tag_set = signature_def_key, tag_set
        self.input_mapping, self.output_mapping = input_mapping, output_mapping
        self.probability_col, self.raw_prediction_col = probability_col, raw_prediction_col
        self.history: Dict[str, List[float]] = {}
        self.results: List[Any] = []
        self.fit_seconds: Optional[float] = None
        self.initial_epoch = 0  # a resumed run_id's fit: the epochs its checkpoint had done

    def __repr__(self) -> str:
        return f"duotf.dask.TFModel({self.model_path!r})"

    def __sklearn_is_fitted__(self) -> bool:
        return bool(self.model_path)

    def __sklearn_tags__(self):
        return _sklearn_tags(requires_fit=False)

    def fit(self, X: Any = None, y: None = None) -> "TFModel":
        """Nothing to learn: the model is fitted. Returns itself (a scikit-learn pipeline calls
        ``fit`` on its last step)."""
        return self

    def transform(self, ddf: dd.DataFrame) -> dd.DataFrame:
        """``ddf`` with the prediction columns added: :meth:`predict` (the Spark twin's
        ``transform``)."""
        return self.predict(ddf)

    def predict(self, ddf: dd.DataFrame) -> dd.DataFrame:
        """``ddf`` with the prediction columns added, lazily (:func:`duotf.dask.predict`), and
        ``argmax_col`` when set."""
        import numpy as np

        try:
            plan = mapping.model_outputs(
                self.model_path, features=self.features_col, prediction=self.prediction_col,
                output_cols=self.output_cols, signature=self.signature_def_key, tags=self.tag_set,
                input_mapping=self.input_mapping, output_mapping=self.output_mapping,
                probability=self.probability_col, raw=self.raw_prediction_col, argmax=self.argmax_col)
        except ConfigError as exc:
            raise _respelled(exc) from None
        out = predict_outputs(ddf, plan.source, plan.model, plan.columns, plan.outputs, self.batch_size)
        output = plan.outputs[0].column
        if self.argmax_col is None or plan.classifier:  # a classifier's: scored as a column
            return out
        if self.argmax_col in out.columns:
            raise ConfigError(f"argmax_col {self.argmax_col!r} is already a column of the "
                              "DataFrame: name it otherwise", param="argmax_col")
        source = output
        if out._meta[source].dtype != object and not hasattr(out._meta[source].dtype, "pyarrow_dtype"):
            raise ConfigError(f"argmax_col={self.argmax_col!r}: the model's output {source!r} is "
                              "one value a row; argmax_col needs an output of several (a class's "
                              "scores)", param="argmax_col")
        meta = out._meta.assign(**{self.argmax_col: np.array([], dtype=np.float64)})
        return out.map_partitions(_argmax, source, self.argmax_col, meta=meta)

    def to_local(self) -> keras.Model:
        """The fitted Keras model, loaded in this process."""
        import keras

        scoring.model_source(self.model_path)  # a missing path is a ConfigError naming it
        return keras.saving.load_model(self.model_path)

    _FIELDS = ("features_col", "prediction_col", "argmax_col", "output_cols", "batch_size",
               "signature_def_key", "tag_set", "input_mapping", "output_mapping", "probability_col",
               "raw_prediction_col", "history", "fit_seconds")

    def save(self, path: str) -> None:
        """Write the model into the folder ``path`` (any fsspec URL): ``metadata.json`` and a
        copy of the saved model, so the folder is whole by itself."""
        from duotf.io.files import filesystem, open_url

        fs, fpath = filesystem(path)
        if fs.exists(fpath):
            raise ConfigError(f"{path!r} exists already: give a new folder", path=path)
        name = self.model_path.rstrip("/").rsplit("/", 1)[-1]
        core.copy_model(self.model_path, path.rstrip("/") + "/model/" + name)
        meta = {k: getattr(self, k) for k in self._FIELDS}
        meta["model_file"] = name
        with open_url(path.rstrip("/") + "/metadata.json", "wb") as f:
            f.write(json.dumps(meta).encode())

    @classmethod
    def load(cls, path: str) -> "TFModel":
        """The model saved by :meth:`save` in the folder ``path`` (any fsspec URL)."""
        from duotf.io.files import open_url

        with open_url(path.rstrip("/") + "/metadata.json") as f:
            # a folder of an earlier duotf has camelCase keys: read them in today's names
            meta = {_DASK_NAMES.get(k, k): v for k, v in json.loads(f.read()).items()}
        # a folder of an earlier duotf lacks the later parameters: they keep their defaults
        model = cls(path.rstrip("/") + "/model/" + meta.pop("model_file"),
                    **{k: meta[k] for k in cls._PARAMS[1:] if k in meta})
        model.history, model.fit_seconds = meta.get("history") or {}, meta.get("fit_seconds")
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
