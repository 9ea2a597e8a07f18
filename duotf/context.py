"""``NodeContext``: what the user's ``main(args, ctx)`` sees on its node."""

from __future__ import annotations

import getpass
import os
import posixpath
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional

if TYPE_CHECKING:  # what a node imports before main stays light: no numpy, no TensorFlow
    import tensorflow as tf

    from duotf._node.reports import Reporter
    from duotf._transport.datafeed import DataFeed
    from duotf._transport.server import FeedServer

__all__ = ["NodeContext", "node_context", "check_feeds_answered"]


class NodeContext:
    """The node's place in the cluster and helpers to use it.

    Attributes
    ----------
    node_id : int
        0-based id of this node in the duotf cluster.
    job_name : str
        ``"chief"``, ``"worker"``, ``"ps"`` or ``"evaluator"``.
    task_index : int
        Index of this node within its job.
    cluster_spec : dict
        The ``cluster`` part of TF_CONFIG: job name -> list of ``host:port``.
    tf_config : dict
        The full TF_CONFIG, also exported in the ``TF_CONFIG`` environment variable.
    num_workers : int
        Number of chief + worker tasks (the replicas of a synchronous strategy).
    is_chief : bool
        True on the chief, or on worker 0 when the spec has no chief.
    working_dir : str
        A directory of this node's own; ``main`` runs with it as the current directory.
    log_dir : str
        The job's log directory for TensorBoard event files (``tf.summary.create_file_writer``,
        Keras' ``TensorBoard`` callback): ``<tensorboard_dir>/<job id>`` with
        ``duotf.run(..., tensorboard_dir=...)`` (a path or a URL, kept), else a directory of
        the job's on this node's host, removed with the job's nodes. With
        ``duotf.run(..., tensorboard=True)`` TensorBoard reads it (on the chief's host).
    default_fs : str
        The cluster's default filesystem (``file://``, ``hdfs://namenode:8020``, ``s3://bucket``).
    protocol : str
        The server protocol of the cluster spec.
    host, port : str, int
        This node's address in the TF cluster; ``port`` is reserved for its TF server.
    gpus : list of str
        The GPUs the engine holds for this node (``ClusterSpec(gpus_per_node=k)``), as its
        ``CUDA_VISIBLE_DEVICES`` names them; TensorFlow sees them as ``/GPU:0`` to
        ``/GPU:k-1``. Empty with ``gpus_per_node=0``, where GPUs are left alone.
    attempt : int
        0 on the first run; 1, 2, ... after each restart (``duotf.run(..., max_restarts=N)``).
    checkpoint_dir : str
        The job's checkpoint location, the same on every node and every attempt:
        ``<checkpoint_dir>/<job id>`` with ``duotf.run(..., checkpoint_dir=...)`` (a path or
        URL every node can write, kept), else a directory of the job's on the driver's host
        (every node must share that filesystem: one host), removed at shutdown.
    resume_epoch : int
        The epoch to resume at: 0 on the first attempt; after a restart, the last epoch every
        node reported a checkpoint of (:meth:`report_checkpoint`). ``cluster.train`` feeds the
        restarted nodes from that epoch on, so pass it to ``model.fit(initial_epoch=...)`` or
        start the training loop's epoch count there.
    """

    def __init__(
        self,
        *,
        node_id: int,
        job_name: str,
        task_index: int,
        tf_config: dict,
        working_dir: str,
        default_fs: str,
        protocol: str,
        host: str,
        port: int,
        job_id: str,
        executor_id: str = "",
        gpus: Optional[List[str]] = None,
        log_dir: str = "",
        attempt: int = 0,
        resume_epoch: int = 0,
        checkpoint_dir: str = "",
        checkpoint: Optional[str] = None,
    ):
        self.node_id = node_id
        self.job_name = job_name
        self.task_index = task_index
        self.tf_config = tf_config
        self.cluster_spec: Dict[str, List[str]] = tf_config["cluster"]
        self.num_workers = len(self.cluster_spec.get("chief", [])) + len(
            self.cluster_spec.get("worker", [])
        )
        has_chief = bool(self.cluster_spec.get("chief"))
        self.is_chief = job_name == "chief" or (
            not has_chief and job_name == "worker" and task_index == 0
        )
        self.working_dir = working_dir
        self.log_dir = log_dir
        self.default_fs = default_fs
        self.protocol = protocol
        self.host = host
        self.port = port
        self.job_id = job_id
        self.executor_id = executor_id
        self.gpus: List[str] = list(gpus or [])
        self._notify: Optional[Callable[[str], None]] = None  # set by node_context
        self._feed_server: Optional[FeedServer] = None  # set by node_context
        self._reporter: Optional[Reporter] = None  # set by node_context
        self._feeds: List[DataFeed] = []
        self._server: Optional[tf.distribute.Server] = None
        self.attempt = attempt
        self.resume_epoch = resume_epoch
        self.checkpoint_dir = checkpoint_dir
        self._checkpoint = checkpoint
        self._on_checkpoint: Optional[Callable[[dict], None]] = None  # set by node_context

    def __repr__(self) -> str:
        return (
            f"<NodeContext {self.job_name}:{self.task_index} node={self.node_id} "
            f"{self.host}:{self.port}>"
        )

    def absolute_path(self, path: str) -> str:
        """Resolve ``path`` against the cluster's default filesystem.

        A URL with a scheme (``s3://b/x``, ``file:///x``) is returned as is. On a local default
        filesystem, a relative path resolves against :attr:`working_dir` and an absolute one stays.
        On a remote default filesystem (``hdfs://nn:8020``), an absolute path gets that prefix and
        a relative one resolves under ``/user/<user>/``, as Hadoop tools do.
        """
        if "://" in path:
            return path
        default = self.default_fs.rstrip("/")
        if default in ("", "file:", "file://"):
            return os.path.abspath(os.path.join(self.working_dir, path))
        if not path.startswith("/"):
            path = posixpath.join("/user", getpass.getuser(), path)
        return default + path

    def get_data_feed(self, train: bool = True,
                      input_mapping: Optional[Dict[str, str]] = None) -> DataFeed:
        """The data that ``cluster.train(data)`` / ``cluster.inference(data)`` pushes to this node.

        Parameters
        ----------
        train:
            False for inference: every row read must get one result through
            ``feed.batch_results``.
        input_mapping:
            ``{column: name}``: select and rename columns; ``next_batch`` then returns a dict of
            arrays (else a list of rows). A key that names no column of the data is a
            :class:`~duotf.errors.ConfigError` at the first read (the first rows' columns are
            the data's), before any row is returned: ``cluster.train`` then raises a
            :class:`~duotf.errors.NodeFailedError` with its message.
        """
        from duotf._transport.datafeed import DataFeed

        if self._feed_server is None:
            raise RuntimeError("this context has no data feed (it was not created by duotf.run)")
        feed = DataFeed(self._feed_server, train=train, input_mapping=input_mapping)
        self._feeds.append(feed)
        return feed

    def report(self, step: Optional[int] = None, **metrics: Any) -> bool:
        """Send metrics to the driver: ``ctx.report(step=100, loss=0.31, accuracy=0.9)``.

        They arrive, in the order this node made them, in ``cluster.metrics`` (a row: node,
        step, time, one column per metric), in the callbacks of ``cluster.on_report`` and in
        the progress bar. ``step`` is a whole number (default: this node's count of reports so
        far); metric values are numbers (ints, floats, numpy scalars, scalar tensors), else a
        :class:`~duotf.errors.ConfigError`. Never waits for the driver: a node sends at most 50
        reports/s (bursts of 500); what is over is dropped and counted (the driver logs the
        count), and the call returns False.
        """
        if self._reporter is None:
            raise RuntimeError("this context cannot report (it was not created by duotf.run)")
        return self._reporter.report(step, metrics)

    def latest_checkpoint(self) -> Optional[str]:
        """The checkpoint this node restores after a restart: the path it (or, if it saved
        none, the first node that saves) gave :meth:`report_checkpoint` for
        :attr:`resume_epoch`. None on the first attempt, and when no checkpoint was reported."""
        return self._checkpoint

    def report_checkpoint(self, epoch: int, path: Optional[str] = None) -> None:
        """Tell the driver that this node's state after ``epoch`` epochs is saved at ``path``
        (a file or directory, e.g. what ``tf.train.CheckpointManager.save()`` returned).

        A restart resumes at the last epoch every reporting node saved (see
        :attr:`resume_epoch`), and hands each node its path for that epoch
        (:meth:`latest_checkpoint`). Call it after the save has completed; keep the previous
        checkpoint too (``max_to_keep=2`` or more), since the driver may learn of the newest
        one only after a failure. ``epoch`` counts the epochs done: 1 after the first.
        """
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 1:
            from duotf.errors import ConfigError

            raise ConfigError(f"epoch={epoch!r}: give the number of epochs done, 1 or more")
        if path is not None and not isinstance(path, str):
            path = os.fspath(path)
        if self._on_checkpoint is not None:
            self._on_checkpoint({"epoch": epoch, "path": path})

    def start_server(self) -> tf.distribute.Server:
        """Start (once) and return this node's ``tf.distribute.Server`` with the spec's protocol.

        Use it for TF1-style between-graph training (``tf.compat.v1`` sessions against
        ``server.target``) or for the workers of a ``ParameterServerStrategy``.
        """
        if self._server is None:
            import tensorflow as tf

            self._server = tf.distribute.Server(
                tf.train.ClusterSpec(self.cluster_spec),
                job_name=self.job_name,
                task_index=self.task_index,
                protocol=self.protocol,
                start=True,
            )
        return self._server

    def serve(self) -> None:
        """Start this node's server and serve until the cluster shuts down; never returns.

        A serving node is stopped quietly at shutdown, like a ps node (the workers of a
        ``ParameterServerStrategy`` call this). The cluster finishes when every node that is not
        serving has returned from ``main``.
        """
        server = self.start_server()
        if self._notify is not None:
            self._notify("serving")
        server.join()


# -- the node process's side (duotf._node.child): not for user code -------------------------------------
def node_context(*, notify: Callable[[str], None], feed_server: Optional[FeedServer],
                 reporter: Optional[Reporter] = None,
                 on_checkpoint: Optional[Callable[[dict], None]] = None, **fields: Any) -> NodeContext:
    """The :class:`NodeContext` of a node process, wired to its agent and its feed.

    ``fields`` are :class:`NodeContext`'s own arguments; ``notify(what)`` tells the node's
    agent of a change it reports to the driver (``"serving"``); ``feed_server`` is the node's
    :class:`~duotf._transport.server.FeedServer`, which ``get_data_feed`` reads from; ``reporter``
    sends what ``ctx.report`` is given (:mod:`duotf._node.reports`).
    """
    ctx = NodeContext(**fields)
    ctx._notify = notify
    ctx._feed_server = feed_server
    ctx._reporter = reporter
    ctx._on_checkpoint = on_checkpoint
    return ctx


def check_feeds_answered(ctx: NodeContext, when: str = "main returned") -> None:
    """Once ``main`` returned: raise the :class:`~duotf.errors.FeedError` of an inference feed
    that ``ctx`` handed out with rows read but left without their results."""
    from duotf._transport.datafeed import check_answered

    for feed in ctx._feeds:
        if not feed.train:
            check_answered(feed, when)
