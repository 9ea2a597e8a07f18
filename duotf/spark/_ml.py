"""Spark ML stages: :class:`TFEstimator` (a ``pyspark.ml.Estimator``) and :class:`TFModel`
(its ``Model``), re-exported by :mod:`duotf.spark` (which imports this module, and pyspark,
only when one of them is asked for).

``TFEstimator.fit(df)`` checks the DataFrame's columns, then runs one duotf cluster on the
DataFrame's own Spark session (:func:`duotf._ml.estimator.fit`) and returns a :class:`TFModel`
holding the saved model's path and the training history. ``TFModel.transform(df)`` scores with
:func:`duotf.spark.predict` (the model loaded once per Python worker and cached, Arrow batches).

Both save and load (``MLWritable``/``MLReadable``): the plain parameters go to Spark ML's JSON
metadata (``DefaultParamsWriter``), so a ``Pipeline`` or ``CrossValidator`` holding them saves
and loads as any other; the functions (``modelFn``, ``trainFn``, ``trainArgs``) are pickled by
value with cloudpickle into ``functions.pkl`` beside it, and a model's file is copied into
the saved folder (``model/``), so the folder is whole by itself.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple, TypeVar

from pyspark import keyword_only
from pyspark.ml import Estimator, Model
from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.ml.util import DefaultParamsReader, DefaultParamsWriter, MLReadable, MLReader, MLWritable, MLWriter

import duotf._ml.estimator as core
from duotf._names import public
from duotf._ml import mapping, scoring
from duotf.errors import ConfigError
from duotf.spark._data import (check_rows, column_checks, enough_rows, is_vector, prepare_columns,
                               split_validation)

if TYPE_CHECKING:  # Keras is imported where a model is loaded
    import keras
    from pyspark.ml.param import ParamMap
    from pyspark.sql import DataFrame

_P = TypeVar("_P", bound=Params)

logger = logging.getLogger(__name__)

__all__ = ["TFEstimator", "TFModel"]

_FUNCTIONS = ("modelFn", "trainFn", "trainArgs", "callbacks")  # pickled by value, not in the JSON metadata
_FUNCTIONS_FILE = "functions.pkl"


def _features(value):
    return list(core.feature_names(value)) if not isinstance(value, str) else value


def _labels(value):
    return list(core.label_names(value)) if not isinstance(value, str) else value


def _string_dict(value):
    if value is None:
        return None
    if not isinstance(value, dict):
        raise TypeError(f"expected a dict of str, got {value!r}")
    return {str(k): str(v) for k, v in value.items()}


def _any(value):
    return value


class _SharedParams(Params):
    """The parameters both stages have."""

    _input_kwargs: Dict[str, Any]  # the keywords of the call, set by pyspark's @keyword_only

    featuresCol = Param(Params._dummy(), "featuresCol", "feature column, or a list of them (one "
                        "per model input): numbers, array<number>, ML vectors or packed tensors",
                        typeConverter=_features)

    def getFeaturesCol(self) -> core.ColumnNames:
        """The value of featuresCol."""
        return self.getOrDefault(self.featuresCol)

    def setFeaturesCol(self: _P, value: core.ColumnNames) -> _P:
        """Set featuresCol."""
        return self._set(featuresCol=value)


@public("duotf.spark")
class TFEstimator(Estimator, _SharedParams, MLReadable, MLWritable):
    """A Spark ML ``Estimator`` training a TensorFlow model on a duotf cluster.

    Each parameter ``x`` below has Spark ML's accessors ``setX``/``getX``: ``setEpochs(3)`` sets
    ``epochs`` and returns the estimator, ``getEpochs()`` reads it.

    Give either ``modelFn``, a function of no arguments returning a compiled Keras model (duotf
    writes the node program: the model built in a ``MultiWorkerMirroredStrategy`` scope, ``fit``
    on the rows Spark feeds each worker, the chief saves ``model.keras``), or ``trainFn(args,
    ctx)``, your own node program (TensorFlowOnSpark's ``TFEstimator`` style): it reads
    ``ctx.get_data_feed()``, and its chief saves the model to ``args["modelPath"]`` (a
    ``.keras`` file) or exports a SavedModel to ``args["exportDir"]``; ``args`` also holds
    ``featuresCol``, ``labelCol``, ``epochs``, ``batchSize``, ``seed`` and your ``trainArgs``
    as ``args["args"]``; its chief's return value, when a dict, is the model's history.

    Parameters (:class:`duotf.dask.TFEstimator` takes them in snake_case): ``featuresCol`` (a column,
    or a list of them, one per model input: numbers, ``array<number>``, ML vectors, packed tensor
    columns), ``labelCol`` (a column, or a list of them, one per model output), ``predictionCol``,
    ``argmaxCol``, ``outputCols`` (``{column: model output name}``: the fitted model's columns
    for a model of several outputs), ``numWorkers``, ``numPs`` (``trainFn`` only),
    ``epochs``, ``batchSize`` (the global batch: each worker's step takes ``batchSize /
    numWorkers`` rows), ``modelDir`` (each fit saves into a new folder of it; by default the
    driver's temp folder, which only a one-host cluster can share), ``env`` (environment of the
    node processes), ``seed`` (the same seed and data give the same model on every engine),
    ``verbose``, ``validationIndicatorCol`` (a boolean column: its True rows are held out) or
    ``validationFraction`` (0 <= f < 1: about that fraction of the rows held out, by a hash of
    each row's fed values seeded with ``seed``): the held-out rows, collected to the driver
    (at most :data:`~duotf._ml.estimator.VALIDATION_MAX_ROWS` rows and
    :data:`~duotf._ml.estimator.VALIDATION_MAX_BYTES`), are Keras's ``validation_data`` on
    every worker (``val_*`` in the history), ``weightCol`` (a number column: Keras's sample
    weights), ``callbacks`` (Keras callbacks, or a function of no arguments returning them,
    pickled to the nodes: a ``ModelCheckpoint`` of a relative path saves in the fit's folder,
    on the chief alone; ``EarlyStopping`` ends the fit and its feed), ``shuffle`` (shuffle
    the rows every epoch, by ``seed``: the same order on every engine; see
    :meth:`duotf.Cluster.train`), ``runId`` (a folder name:
    the fit's folder is ``modelDir/<runId>`` instead of a new one, a ``modelFn`` fit keeps a
    checkpoint there every epoch, and a fit interrupted, its driver gone, goes on from that
    checkpoint when fit again with the same ``runId``; a finished run returns its model
    untrained; see :mod:`duotf._ml.resume`), ``mlflowLogging`` (default True: a ``modelFn`` fit
    inside an active MLflow run logs its parameters, each epoch's metrics and the model to it
    from the chief; the ``mlflow`` extra; a ``trainFn`` gets the run as ``args["mlflow"]``).

    ``fit(df)`` checks the columns before anything runs (a :class:`~duotf.ConfigError` names a
    missing column, a wrong type, an array column whose rows differ in length, a null), then
    books its task slots (the nodes hold one each, and feeding needs one more): slots that other
    fits of this process hold are waited for (a ``CrossValidator`` with ``parallelism`` larger
    than fits at once), too many for the engine are an :class:`~duotf.InsufficientSlotsError`
    at once (see :mod:`duotf._ml.estimator`). :meth:`fitMultiple` (what ``CrossValidator`` and
    ``TrainValidationSplit`` call) stops the other fits of a group when one fails.
    """

    modelFn = Param(Params._dummy(), "modelFn", "a function of no arguments returning a compiled "
                    "Keras model", typeConverter=_any)
    trainFn = Param(Params._dummy(), "trainFn", "a node program trainFn(args, ctx)", typeConverter=_any)
    trainArgs = Param(Params._dummy(), "trainArgs", "what trainFn gets as args['args']",
                      typeConverter=_any)
    labelCol = Param(Params._dummy(), "labelCol", "label column, or a list of them (one per model "
                     "output)", typeConverter=_labels)
    predictionCol = Param(Params._dummy(), "predictionCol", "the fitted model's prediction column",
                          typeConverter=TypeConverters.toString)
    argmaxCol = Param(Params._dummy(), "argmaxCol", "the fitted model's column of the index of "
                      "the largest output value (a double, as Spark ML classifiers predict)",
                      typeConverter=TypeConverters.toString)
    outputCols = Param(Params._dummy(), "outputCols", "{column: model output name}, for a model "
                       "of several outputs", typeConverter=_string_dict)
    numWorkers = Param(Params._dummy(), "numWorkers", "workers (MultiWorkerMirroredStrategy "
                       "replicas)", typeConverter=TypeConverters.toInt)
    numPs = Param(Params._dummy(), "numPs", "parameter servers (trainFn only)",
                  typeConverter=TypeConverters.toInt)
    epochs = Param(Params._dummy(), "epochs", "epochs", typeConverter=TypeConverters.toInt)
    batchSize = Param(Params._dummy(), "batchSize", "global batch size", typeConverter=TypeConverters.toInt)
    modelDir = Param(Params._dummy(), "modelDir", "folder each fit saves a new model folder in",
                     typeConverter=TypeConverters.toString)
    env = Param(Params._dummy(), "env", "environment variables of the node processes",
                typeConverter=_string_dict)
    seed = Param(Params._dummy(), "seed", "random seed of the nodes", typeConverter=TypeConverters.toInt)
    verbose = Param(Params._dummy(), "verbose", "Keras fit verbosity", typeConverter=TypeConverters.toInt)
    validationIndicatorCol = Param(Params._dummy(), "validationIndicatorCol", "boolean column: "
                                   "True rows are held out to validate on", typeConverter=TypeConverters.toString)
    validationFraction = Param(Params._dummy(), "validationFraction", "fraction of the rows held "
                               "out to validate on (0 <= f < 1), chosen by a seeded hash of each "
                               "row", typeConverter=TypeConverters.toFloat)
    weightCol = Param(Params._dummy(), "weightCol", "sample weight column", typeConverter=TypeConverters.toString)
    callbacks = Param(Params._dummy(), "callbacks", "Keras callbacks (a list, or a function of no "
                      "arguments returning one), shipped to the nodes", typeConverter=_any)
    shuffle = Param(Params._dummy(), "shuffle", "shuffle the rows every epoch (by seed)",
                    typeConverter=TypeConverters.toBoolean)
    runId = Param(Params._dummy(), "runId", "the fit's folder in modelDir: a fit interrupted "
                  "resumes from its last checkpoint there when fit again with the same runId",
                  typeConverter=TypeConverters.toString)
    mlflowLogging = Param(Params._dummy(), "mlflowLogging", "whether a fit inside an active MLflow "
                          "run logs to it", typeConverter=TypeConverters.toBoolean)

    @keyword_only
    def __init__(self, *, modelFn: Optional[core.ModelFn] = None,
                 trainFn: Optional[core.TrainFn] = None, trainArgs: Any = None,
                 featuresCol: core.ColumnNames = "features",
                 labelCol: Optional[core.ColumnNames] = "label", predictionCol: str = "prediction",
                 argmaxCol: Optional[str] = None, outputCols: Optional[Dict[str, str]] = None,
                 numWorkers: int = 1, numPs: int = 0, epochs: int = 1, batchSize: int = 32,
                 modelDir: Optional[str] = None, env: Optional[Dict[str, str]] = None,
                 seed: Optional[int] = None, verbose: int = 0,
                 validationIndicatorCol: Optional[str] = None, validationFraction: float = 0.0,
                 weightCol: Optional[str] = None, callbacks: Optional[core.Callbacks] = None,
                 shuffle: bool = False, runId: Optional[str] = None, mlflowLogging: bool = True):
        super().__init__()
        self._setDefault(featuresCol="features", labelCol="label", predictionCol="prediction",
                         numWorkers=1, numPs=0, epochs=1, batchSize=32, verbose=0,
                         validationFraction=0.0, shuffle=False, mlflowLogging=True)
        self._set(**{k: v for k, v in self._input_kwargs.items() if v is not None})

    @keyword_only
    def setParams(self, *, modelFn: Optional[core.ModelFn] = None,
                  trainFn: Optional[core.TrainFn] = None, trainArgs: Any = None,
                  featuresCol: core.ColumnNames = "features",
                  labelCol: Optional[core.ColumnNames] = "label", predictionCol: str = "prediction",
                  argmaxCol: Optional[str] = None, outputCols: Optional[Dict[str, str]] = None,
                  numWorkers: int = 1, numPs: int = 0, epochs: int = 1, batchSize: int = 32,
                  modelDir: Optional[str] = None, env: Optional[Dict[str, str]] = None,
                  seed: Optional[int] = None, verbose: int = 0,
                  validationIndicatorCol: Optional[str] = None, validationFraction: float = 0.0,
                  weightCol: Optional[str] = None, callbacks: Optional[core.Callbacks] = None,
                  shuffle: bool = False, runId: Optional[str] = None,
                  mlflowLogging: bool = True) -> "TFEstimator":
        """Set the parameters given (those left None keep their values)."""
        return self._set(**{k: v for k, v in self._input_kwargs.items() if v is not None})

    def _value(self, name: str):
        param = self.getParam(name)
        return self.getOrDefault(param) if self.isDefined(param) else None

    def config(self) -> core.FitConfig:
        """The checked fit parameters (a :class:`~duotf.ConfigError` names a bad one)."""
        return core.FitConfig.from_params({name: self._value(name) for name in core.FIT_PARAMS})

    def _fit(self, dataset) -> "TFModel":
        return self._fit_in(dataset)

    def _fit_in(self, dataset, group: Optional[core.FitGroup] = None,
                checks: Optional["_DataChecks"] = None) -> "TFModel":
        from duotf.backends.spark.backend import SparkBackend

        config = self.config()
        data = prepare_columns(dataset, config)
        if checks is None:
            check_rows(data, config)
        else:
            checks.check(data, config)
        train, validation = split_validation(data, config)
        session = dataset.sparkSession
        backend = SparkBackend(session)
        result = core.fit(config, backend, backend.client.key, train, feed_slots=1, group=group,
                          validation=validation)
        model = TFModel(featuresCol=self.getFeaturesCol(), predictionCol=self._value("predictionCol"),
                        argmaxCol=self._value("argmaxCol"), outputCols=self._value("outputCols"),
                        modelPath=result.modelPath)
        model.history = result.history
        model.results = result.results
        model.fitSeconds = result.seconds
        model.initialEpoch = result.initialEpoch
        return model

    def fitMultiple(self, dataset: DataFrame, paramMaps: Sequence[ParamMap]) -> "_FitGroupIterator":
        """One model per param map of ``paramMaps``, as ``CrossValidator`` and
        ``TrainValidationSplit`` ask (pyspark's contract: an iterator whose ``next()`` is
        thread-safe, called from their thread pool, and gives ``(index, model)``).

        The fits are one :class:`~duotf._ml.estimator.FitGroup`: when one fails, the fits not yet
        started do not start, those waiting for slots stop waiting, the clusters of those
        running are shut down at once, and every later ``next()`` raises that fit's error, each
        only once nothing of the group runs any more. The data checks (columns, nulls, array
        lengths: one Spark job) run once per set of columns, not once per param map.

        ``runId`` is refused here (a :class:`~duotf.ConfigError`): it names one fit, and the fits
        of a group, or of a ``CrossValidator``'s folds (each fold calls this with the same param
        maps), would share its folder.
        """
        if self._value("runId") is not None or any(self.runId in m for m in paramMaps):
            raise ConfigError("runId names one fit's folder, and fitMultiple (CrossValidator, "
                              "TrainValidationSplit) runs several fits: unset runId here (each "
                              "fit then gets a new folder of modelDir)", param="runId")
        return _FitGroupIterator(self.copy(), dataset, list(paramMaps))

    def write(self) -> MLWriter:
        return _Writer(self)

    @classmethod
    def read(cls) -> MLReader:
        return _Reader(cls)


class _FitGroupIterator:
    """What :meth:`TFEstimator.fitMultiple` returns: thread-safe ``next()`` giving ``(index,
    model)``; the fits share one :class:`~duotf._ml.estimator.FitGroup` and one
    :class:`_DataChecks`."""

    def __init__(self, estimator: TFEstimator, dataset, param_maps: list):
        self.estimator = estimator
        self.dataset = dataset
        self.param_maps = param_maps
        self.group = core.FitGroup()
        self.checks = _DataChecks()
        self._lock = threading.Lock()
        self._counter = 0

    def __iter__(self):
        return self

    def __next__(self):
        with self._lock:
            index = self._counter
            if index >= len(self.param_maps):
                raise StopIteration("No models remaining.")
            self._counter += 1
        group = self.group
        try:
            with group.member():
                model = self.estimator.copy(self.param_maps[index])._fit_in(
                    self.dataset, group, self.checks)
        except BaseException as exc:
            group.fail(exc)
        if group.failed:  # this fit's error, or another's (then a model of this one is moot)
            group.settle()
            group.raise_error()
        return index, model

    next = __next__


class _DataChecks:
    """:func:`check_rows` once per set of fed columns of one DataFrame, for the fits of a
    group (their param maps may change the columns, and numWorkers)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._rows: Dict[tuple, Tuple[int, int]] = {}

    def check(self, data, config: core.FitConfig) -> None:
        key = (tuple(config.columns), config.features, config.split_column,
               config.validationFraction, config.split_seed)
        with self._lock:  # the first fit checks; the others wait for it and reuse its count
            if key not in self._rows:
                self._rows[key] = column_checks(data, config.split_column)
        enough_rows(self._rows[key], config)


@public("duotf.spark")
class TFModel(Model, _SharedParams, MLReadable, MLWritable):
    """The fitted model of :class:`TFEstimator`. Each parameter ``x`` below has Spark ML's
    accessors ``setX``/``getX`` (``setBatchSize(256)``, ``getBatchSize()``).

    ``transform(df)`` adds ``predictionCol`` (the
    model's output: a double for one value a row, ``array<float>`` for several), or one column
    per model output named by ``outputCols`` (``{column: output name}``), and ``argmaxCol`` when
    set (the index of the largest value of the output, a double, for Spark ML's
    ``MulticlassClassificationEvaluator``). Scoring runs in Spark's Python workers, the model
    loaded once per worker and cached (:func:`duotf.spark.predict`); feature columns that are ML
    vectors are turned into arrays first.

    TensorFlowOnSpark's parameters choose what of a SavedModel scores: ``signatureDefKey``
    (default ``"serving_default"``) and ``tagSet`` (its MetaGraph's tags, comma-separated,
    default ``"serve"``), ``inputMapping`` (``{column: signature input name}``, in place of
    ``featuresCol``) and ``outputMapping`` (``{signature output name: column}``, in place of
    ``outputCols``). A ``.keras`` model has no signatures: a ``signatureDefKey`` or ``tagSet``
    other than the default is a :class:`~duotf.ConfigError`, and so is a name the signature
    lacks (the message lists its names).

    A classifier's columns, as Spark ML's classifiers have them: with ``probabilityCol`` or
    ``rawPredictionCol`` set, the model's scores (its only output, or the first of
    ``outputMapping``/``outputCols``) give ``rawPredictionCol`` (the scores), ``probabilityCol``
    (a row already in [0, 1] summing to 1 as it is, any other row's softmax) as ML vectors, and
    ``predictionCol`` becomes the class, the index of the largest score (a double).

    ``batchSize`` is the rows one call of the model takes when scoring.

    ``history`` is the chief's Keras history (``{metric: [value per epoch]}``), ``modelPath``
    the saved model (``to_local()`` loads it as a Keras model), ``initialEpoch`` the epoch a
    fit of a ``runId`` resumed at (0: it started anew).
    """

    predictionCol = TFEstimator.predictionCol
    argmaxCol = TFEstimator.argmaxCol
    outputCols = TFEstimator.outputCols
    modelPath = Param(Params._dummy(), "modelPath", "the saved model (.keras file or SavedModel "
                      "folder)", typeConverter=TypeConverters.toString)
    batchSize = Param(Params._dummy(), "batchSize", "rows per model call when scoring",
                      typeConverter=TypeConverters.toInt)
    signatureDefKey = Param(Params._dummy(), "signatureDefKey", "the SavedModel signature that "
                            "scores", typeConverter=TypeConverters.toString)
    tagSet = Param(Params._dummy(), "tagSet", "the tags of the SavedModel's MetaGraph, "
                   "comma-separated", typeConverter=TypeConverters.toString)
    inputMapping = Param(Params._dummy(), "inputMapping", "{column: signature input name} (in "
                         "place of featuresCol)", typeConverter=_string_dict)
    outputMapping = Param(Params._dummy(), "outputMapping", "{signature output name: column} (in "
                          "place of outputCols)", typeConverter=_string_dict)
    probabilityCol = Param(Params._dummy(), "probabilityCol", "a classifier's class probabilities "
                           "(an ML vector); empty: none", typeConverter=TypeConverters.toString)
    rawPredictionCol = Param(Params._dummy(), "rawPredictionCol", "a classifier's scores (an ML "
                             "vector); empty: none", typeConverter=TypeConverters.toString)

    @keyword_only
    def __init__(self, *, featuresCol: core.ColumnNames = "features", predictionCol: str = "prediction",
                 argmaxCol: Optional[str] = None, outputCols: Optional[Dict[str, str]] = None,
                 modelPath: Optional[str] = None, batchSize: int = scoring.DEFAULT_BATCH_SIZE,
                 signatureDefKey: str = scoring.DEFAULT_SIGNATURE, tagSet: str = "serve",
                 inputMapping: Optional[Dict[str, str]] = None,
                 outputMapping: Optional[Dict[str, str]] = None, probabilityCol: str = "",
                 rawPredictionCol: str = ""):
        super().__init__()
        self._setDefault(featuresCol="features", predictionCol="prediction",
                         batchSize=scoring.DEFAULT_BATCH_SIZE, signatureDefKey=scoring.DEFAULT_SIGNATURE,
                         tagSet="serve", probabilityCol="", rawPredictionCol="")
        self._set(**{k: v for k, v in self._input_kwargs.items() if v is not None})
        self.history: Dict[str, List[float]] = {}
        self.results: List[Any] = []
        self.fitSeconds: Optional[float] = None
        self.initialEpoch = 0  # a resumed runId's fit: the epochs its checkpoint had done

    def copy(self, extra: Optional[ParamMap] = None) -> "TFModel":
        that = super().copy(extra)
        that.history, that.results, that.fitSeconds = self.history, self.results, self.fitSeconds
        that.initialEpoch = self.initialEpoch
        return that

    def _value(self, name: str):
        param = self.getParam(name)
        return self.getOrDefault(param) if self.isDefined(param) else None

    def getModelPath(self) -> str:
        return self._value("modelPath")

    def to_local(self) -> keras.Model:
        """The fitted Keras model, loaded in this process."""
        import keras

        return keras.saving.load_model(self._checked_path())

    def _checked_path(self) -> str:
        path = self._value("modelPath")
        if path is None:
            raise ConfigError("TFModel has no modelPath: set it to a saved model (.keras file or "
                              "SavedModel folder)", param="modelPath")
        scoring.model_source(path)  # a missing path is a ConfigError naming it
        return path

    def _scoring(self) -> mapping.Scoring:
        """The parameters resolved against the model (loaded here once, then cached)."""
        return mapping.model_outputs(
            self._checked_path(), features=self.getFeaturesCol(), prediction=self._value("predictionCol"),
            output_cols=self._value("outputCols"), signature=self._value("signatureDefKey"),
            tags=self._value("tagSet"), input_mapping=self._value("inputMapping"),
            output_mapping=self._value("outputMapping"), probability=self._value("probabilityCol"),
            raw=self._value("rawPredictionCol"), argmax=self._value("argmaxCol"))

    def _transform(self, dataset):
        from pyspark.sql import functions as F

        plan = self._scoring()
        renamed = {}
        for name in plan.columns:
            if name in dataset.columns and is_vector(dataset.schema[name].dataType):
                renamed[name] = f"__duotf_{name}"
        df = dataset
        for name, tmp in renamed.items():
            from pyspark.ml.functions import vector_to_array

            df = df.withColumn(tmp, vector_to_array(F.col(name), "float32"))
        argmax = self._value("argmaxCol")
        if argmax is not None and argmax in df.columns:
            raise ConfigError(f"argmaxCol {argmax!r} is already a column of the DataFrame: name "
                              "it otherwise", param="argmaxCol")
        out = _spark_predict(df, plan, [renamed.get(n, n) for n in plan.columns],
                             self.getOrDefault(self.batchSize))
        if renamed:
            out = out.drop(*renamed.values())
        if plan.classifier:
            from pyspark.ml.functions import array_to_vector

            for made in plan.outputs:  # Spark ML's classifiers give their scores as ML vectors
                if made.derive in ("raw", "probability"):
                    out = out.withColumn(made.column, array_to_vector(F.col(made.column)))
        if argmax is not None and not plan.classifier:  # a classifier's: scored as a column
            source = plan.outputs[0].column
            kind = out.schema[source].dataType.simpleString()
            if not kind.startswith("array"):
                raise ConfigError(f"argmaxCol={argmax!r}: the model's output {source!r} is one "
                                  f"value a row ({kind}); argmaxCol needs an output of several "
                                  "(a class's scores)", param="argmaxCol")
            # in SQL: PySpark 3.5's array_position takes a value, not a column
            quoted = source.replace("`", "``")
            out = out.withColumn(argmax, (F.expr(f"array_position(`{quoted}`, array_max(`{quoted}`))")
                                          - 1).cast("double"))
        return out

    def write(self) -> MLWriter:
        return _Writer(self)

    @classmethod
    def read(cls) -> MLReader:
        return _Reader(cls)


def _spark_predict(df, plan: mapping.Scoring, columns, batch_size):
    from duotf.spark._scoring import predict_outputs

    return predict_outputs(df, plan.source, plan.model, columns, plan.outputs, batch_size)


# -- save and load ---------------------------------------------------------------------------------
_MODEL_FOLDER = "model"


def _metadata_target(session):
    """What pyspark.ml's DefaultParamsWriter and DefaultParamsReader take: the session (PySpark
    4, Spark Connect's too), or its SparkContext (classic PySpark 3.5)."""
    import pyspark

    return session if int(pyspark.__version__.split(".")[0]) >= 4 else session.sparkContext


class _Writer(MLWriter):
    def __init__(self, instance):
        super().__init__()
        self.instance = instance

    def _handleOverwrite(self, path: str) -> None:
        """``write().overwrite()``: PySpark's own asks the JVM through ``_jsparkSession``, which a
        Spark Connect session has not; there the folder goes as it was written (fsspec)."""
        from duotf.backends.spark.client import is_connect
        from duotf.io.files import filesystem

        if not is_connect(self.sparkSession):
            super()._handleOverwrite(path)
            return
        fs, fpath = filesystem(path)
        if fs.exists(fpath):
            fs.rm(fpath, recursive=True)

    def saveImpl(self, path: str) -> None:
        import cloudpickle

        from duotf.io.files import open_url

        inst = self.instance
        plain = {p.name: v for p, v in inst._paramMap.items()
                 if p.name not in _FUNCTIONS and v is not None}
        extra: Dict[str, Any] = {"duotf": 1}
        if isinstance(inst, TFModel):
            source = plain.pop("modelPath", None)
            if source is not None:
                name = source.rstrip("/").rsplit("/", 1)[-1]
                extra.update(modelFile=name, history=inst.history, fitSeconds=inst.fitSeconds)
        DefaultParamsWriter.saveMetadata(inst, path, _metadata_target(self.sparkSession),
                                         extraMetadata=extra, paramMap=plain)
        if isinstance(inst, TFModel) and source is not None:
            core.copy_model(source, path.rstrip("/") + f"/{_MODEL_FOLDER}/{name}")
        functions = {p.name: v for p, v in inst._paramMap.items() if p.name in _FUNCTIONS}
        if functions:
            with open_url(path.rstrip("/") + "/" + _FUNCTIONS_FILE, "wb") as f:
                f.write(cloudpickle.dumps(functions))


class _Reader(MLReader):
    def __init__(self, cls):
        super().__init__()
        self.cls = cls

    def load(self, path: str):
        import pickle

        from duotf.io.files import filesystem, open_url

        metadata = DefaultParamsReader.loadMetadata(path, _metadata_target(self.sparkSession))
        inst = self.cls()
        inst._resetUid(metadata["uid"])
        DefaultParamsReader.getAndSetParams(inst, metadata)
        fs, fpath = filesystem(path.rstrip("/") + "/" + _FUNCTIONS_FILE)
        if fs.exists(fpath):
            with open_url(path.rstrip("/") + "/" + _FUNCTIONS_FILE) as f:
                inst._set(**pickle.loads(f.read()))
        if isinstance(inst, TFModel):
            if metadata.get("modelFile"):
                inst._set(modelPath=path.rstrip("/") + f"/{_MODEL_FOLDER}/{metadata['modelFile']}")
            inst.history = metadata.get("history") or {}
            inst.fitSeconds = metadata.get("fitSeconds")
        return inst



def _accessors(cls, names):
    """Spark ML's ``setX``/``getX`` for every parameter (``est.setEpochs(3)``)."""
    for name in names:
        upper = name[0].upper() + name[1:]

        def setter(self: _P, value: Any, _name: str = name) -> _P:
            return self._set(**{_name: value})

        def getter(self: Params, _name: str = name) -> Any:
            return self.getOrDefault(self.getParam(_name))

        setter.__doc__, getter.__doc__ = f"Set {name}.", f"The value of {name}."
        for prefix, fn in (("set", setter), ("get", getter)):
            if not hasattr(cls, prefix + upper):
                setattr(cls, prefix + upper, fn)


_accessors(TFEstimator, ["modelFn", "trainFn", "trainArgs", "labelCol", "predictionCol", "argmaxCol",
                         "outputCols", "numWorkers", "numPs", "epochs", "batchSize", "modelDir", "env", "seed",
                         "verbose", "validationIndicatorCol", "validationFraction", "weightCol",
                         "callbacks", "shuffle", "runId", "mlflowLogging"])
_accessors(TFModel, ["predictionCol", "argmaxCol", "outputCols", "batchSize", "signatureDefKey",
                     "tagSet", "inputMapping", "outputMapping", "probabilityCol", "rawPredictionCol"])
