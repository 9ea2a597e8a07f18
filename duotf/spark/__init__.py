"""duotf's Spark-facing names: feed acceleration for Spark DataFrames, and scoring them with a
saved model in Spark's own tasks; the Spark ML stages :class:`TFEstimator` and :class:`TFModel`.

``import duotf.spark`` does not import pyspark, nor changes any warnings filter; the functions
import pyspark when called, and filter pyspark's notice about pandas 3 unless verbose
(:func:`duotf.set_verbose`).
"""

from duotf.backends.spark.frames import CachedPartition, FeedCache, feed_cache, pack_tensors
from duotf.spark._scoring import PredictUDF, predict, predict_udf
from duotf.spark._stream import SparkStream, feed_stream
from duotf.reports import SparkStreamReport
from duotf._names import lazy as _lazy


# The ML stages subclass pyspark's classes: importing them imports pyspark.
__getattr__, __dir__ = _lazy(__name__, {"TFEstimator": "duotf.spark._ml", "TFModel": "duotf.spark._ml"})


# TFEstimator and TFModel are left out: ``import *`` would import pyspark with them.
__all__ = ["feed_cache", "FeedCache", "CachedPartition", "pack_tensors", "predict_udf", "predict",
           "PredictUDF", "feed_stream", "SparkStream", "SparkStreamReport"]
