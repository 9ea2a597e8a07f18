"""duotf's Spark-facing names: feed acceleration for Spark DataFrames, and scoring them with a
saved model in Spark's own tasks.

``import duotf.spark`` does not import pyspark; the functions do when called.
"""

from .backends.spark_feed import CachedPartition, FeedCache, feed_cache, pack_tensors
from .backends.spark_scoring import PredictUDF, predict, predict_udf

__all__ = ["feed_cache", "FeedCache", "CachedPartition", "pack_tensors", "predict_udf", "predict",
           "PredictUDF"]
