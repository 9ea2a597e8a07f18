"""duotf's Spark-facing names: feed acceleration for Spark DataFrames.

``import duotf.spark`` does not import pyspark; the functions do when called.
"""

from .backends.spark_feed import CachedPartition, FeedCache, feed_cache, pack_tensors

__all__ = ["feed_cache", "FeedCache", "CachedPartition", "pack_tensors"]
