"""A ``tf.data.Dataset`` of TFRecords from URLs, sharded by file across the nodes of a cluster."""

from __future__ import annotations

from typing import TYPE_CHECKING, Dict, List, Optional, Protocol, Sequence, Tuple, Union

from duotf.errors import ConfigError
from duotf.io.files import expand
from duotf.io.tfrecord import TFRecordReader, resolve_compression

if TYPE_CHECKING:  # TensorFlow is imported where a dataset is made
    import tensorflow as tf

__all__ = ["tfrecord_dataset", "worker_rank", "shard_files", "NodePlace"]


class NodePlace(Protocol):
    """Where a node sits in its cluster, as sharding by file reads it: the node's
    :class:`duotf.NodeContext` (``ctx``) is one."""

    @property
    def job_name(self) -> str:
        """``"chief"``, ``"worker"``, ``"ps"`` or ``"evaluator"``."""

    @property
    def task_index(self) -> int:
        """The node's index among the nodes of its job."""

    @property
    def num_workers(self) -> int:
        """The chief and the workers: the nodes that share the training data."""

    @property
    def cluster_spec(self) -> Dict[str, List[str]]:
        """``{job: [host:port, ...]}``."""


def worker_rank(ctx: NodePlace) -> Tuple[Optional[int], int]:
    """``(rank, count)`` of this node among the chief and workers (the chief is rank 0); rank
    None for a ps or an evaluator, which get no share."""
    has_chief = bool(ctx.cluster_spec.get("chief"))
    if ctx.job_name == "chief":
        return 0, ctx.num_workers
    if ctx.job_name == "worker":
        return ctx.task_index + int(has_chief), ctx.num_workers
    return None, ctx.num_workers  # ps / evaluator: no share of the training data


def shard_files(files: Sequence[str], ctx: NodePlace) -> List[str]:
    """This node's files: every ``count``-th file from its ``rank``; all files for an evaluator."""
    rank, count = worker_rank(ctx)
    if rank is None:
        return list(files)
    if len(files) < count:
        raise ConfigError(
            f"{len(files)} file(s) for {count} workers: sharding by file would leave "
            f"{count - len(files)} worker(s) without data. Write at least {count} files "
            "(one per partition), or pass ctx=None and shard the records yourself."
        )
    return list(files[rank::count])


def _is_local(url: str) -> bool:
    return "://" not in url or url.startswith("file://")


def tfrecord_dataset(
    urls: Union[str, Sequence[str]],
    ctx: Optional[NodePlace] = None,
    *,
    compression: Optional[str] = "infer",
    storage_options: Optional[dict] = None,
    num_parallel_reads: int = 4,
    reader: str = "auto",
    skip_corrupt: bool = False,
) -> tf.data.Dataset:
    """A dataset of serialized records from a URL, glob, directory or list of them.

    With ``ctx`` each node reads its own share of the files (see :func:`shard_files`), and the
    dataset's auto-shard policy is OFF, so that ``MultiWorkerMirroredStrategy`` (Keras ``fit``)
    does not shard the node's share again (leaving a worker a quarter of the files, or none).
    Files are
    interleaved ``num_parallel_reads`` at a time, one record from each in turn, in a fixed order.
    ``reader="auto"`` uses TensorFlow's native reader for local files and duotf's fsspec reader for
    every other URL (s3, gs, hdfs, http, memory...); both give the same records in the same order.
    """
    import tensorflow as tf

    files = expand(urls, storage_options)
    if ctx is not None:
        files = shard_files(files, ctx)
    codecs = {resolve_compression(compression, f) for f in files}
    if len(codecs) > 1:
        raise ConfigError(f"the files mix compressions {sorted(codecs)}; pass compression=...")
    codec = codecs.pop()
    cycle = max(1, min(num_parallel_reads, len(files)))
    native = reader == "native" or (reader == "auto" and all(map(_is_local, files)) and not skip_corrupt)
    if reader not in ("auto", "native", "fsspec"):
        raise ConfigError(f"reader={reader!r}: use 'auto', 'native' or 'fsspec'")
    if native:
        paths = [f[len("file://"):] if f.startswith("file://") else f for f in files]
        dataset = tf.data.TFRecordDataset(
            paths, compression_type="" if codec == "NONE" else codec, num_parallel_reads=cycle
        )
        return dataset if ctx is None else _not_sharded_again(dataset)

    def records(url):
        reader_ = TFRecordReader(url.decode(), codec, storage_options=storage_options,
                                 skip_corrupt=skip_corrupt)
        for batch in reader_.batches():
            yield from batch

    spec = tf.TensorSpec(shape=(), dtype=tf.string)
    dataset = tf.data.Dataset.from_tensor_slices(files).interleave(
        lambda url: tf.data.Dataset.from_generator(records, args=(url,), output_signature=spec),
        cycle_length=cycle, block_length=1, num_parallel_calls=cycle, deterministic=True,
    )
    return dataset if ctx is None else _not_sharded_again(dataset)


def _not_sharded_again(dataset):
    import tensorflow as tf

    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return dataset.with_options(options)
