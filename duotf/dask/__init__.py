"""duotf's Dask-facing names, the twins of :mod:`duotf.spark`'s: scoring Dask DataFrames with a
saved model in the Dask workers (:func:`predict`, :func:`predict_udf`), the ML stages
:class:`TFEstimator` (``fit(ddf)``) and :class:`TFModel` (``predict(ddf)``, ``transform(ddf)``,
``to_local()``), scikit-learn pipeline stages with snake_case parameters (``model_fn``,
``features_col``, ``num_workers``, ...: the spelling of scikit-learn, dask-ml and
``xgboost.dask``; Spark ML's camelCase is refused with the snake_case name), and training from
a stream of futures (:func:`feed_stream`).

``import duotf.dask`` imports neither dask, distributed, pandas nor numpy: each name is
imported from its module (``_scoring``, ``_ml``, ``_stream``) when first asked for.

The names of :mod:`duotf.spark` that have no Dask meaning, and the Dask way instead:

- ``feed_cache``, ``FeedCache``, ``CachedPartition``: Spark converts a DataFrame once into feed
  frames that its JVM writes to the executors' local disks, so later epochs skip the JVM and
  Arrow. A Dask partition is already a pandas frame in a worker's memory: ``ddf.persist()``
  (then ``cluster.train(ddf, epochs)``) keeps it there, computed once, for every epoch.
- ``pack_tensors``: packs ``array<number>`` columns into binary tensor columns in the JVM, which
  otherwise turns arrays into Arrow one element at a time. Dask has no JVM between the data and
  Python: an array column is numpy arrays (object dtype) or an Arrow list column
  (``pd.ArrowDtype(pa.list_(pa.float32()))``) in the worker's own process, and :func:`predict`
  reads an Arrow list column through its buffers as it is.
- ``SparkStream``: :func:`duotf.spark.feed_stream` returns a handle on a Structured Streaming
  query that runs in the background (``stop``, ``wait``, ``report``); :func:`feed_stream` here
  feeds in the calling thread until the iterable of futures ends and returns the counts (a
  :class:`~duotf.reports.DaskStreamReport`, the twin of ``SparkStreamReport``), so there is no
  stream object to name. Run it in a thread to train beside other work.
"""

from __future__ import annotations

from duotf._names import lazy as _lazy

#: each public name -> the module that defines it (imported on first use)
_WHERE = {
    "predict": "duotf.dask._scoring",
    "predict_udf": "duotf.dask._scoring",
    "PredictUDF": "duotf.dask._scoring",
    "TFEstimator": "duotf.dask._ml",
    "TFModel": "duotf.dask._ml",
    "feed_stream": "duotf.dask._stream",
    "DaskStreamReport": "duotf.reports",
}

__all__ = ["predict", "predict_udf", "PredictUDF", "TFEstimator", "TFModel", "feed_stream",
           "DaskStreamReport"]


__getattr__, __dir__ = _lazy(__name__, _WHERE)
