"""``duotf.run``: start a TensorFlow cluster on an engine."""

from __future__ import annotations

import os
from typing import Any, Callable, Dict, Optional, Tuple

from duotf.backends import resolve_backend
from duotf._driver.cluster import Cluster
from duotf.errors import ConfigError
from duotf.spec import seconds
from duotf.spec import ClusterSpec
from duotf._verbosity import node_env, set_verbose

__all__ = ["run", "check_run_arguments"]


def _setting(value, env_name: str, default: float) -> float:
    """Keyword argument beats environment variable beats default."""
    if value is not None:
        return seconds(value, env_name[len("DUOTF_"):].lower())
    if env_name in os.environ:
        try:
            number = float(os.environ[env_name])
        except ValueError:
            raise ConfigError(f"{env_name}={os.environ[env_name]!r} is not a number of seconds")
        return seconds(number, env_name)
    return default


def check_run_arguments(
    main, spec: Optional[ClusterSpec], reservation_timeout=None, heartbeat_interval=None,
    heartbeat_timeout=None,
) -> Tuple[ClusterSpec, Tuple[float, float, float]]:
    """The spec (default ``ClusterSpec()``) and the resolved timeouts of a :func:`run` call, or
    the :class:`ConfigError` it would raise before starting anything."""
    spec = spec if spec is not None else ClusterSpec()
    if not isinstance(spec, ClusterSpec):
        raise ConfigError(f"spec must be a duotf.ClusterSpec, got {type(spec).__name__}")
    if not callable(main):
        raise ConfigError(f"main must be callable as main(args, ctx), got {type(main).__name__}")
    reservation_timeout = _setting(reservation_timeout, "DUOTF_RESERVATION_TIMEOUT", 120.0)
    heartbeat_interval = _setting(heartbeat_interval, "DUOTF_HEARTBEAT_INTERVAL", 1.0)
    heartbeat_timeout = _setting(heartbeat_timeout, "DUOTF_HEARTBEAT_TIMEOUT", 30.0)
    if heartbeat_timeout <= 2 * heartbeat_interval:
        raise ConfigError(
            f"heartbeat_timeout={heartbeat_timeout:g} must exceed twice "
            f"heartbeat_interval={heartbeat_interval:g}"
        )
    return spec, (reservation_timeout, heartbeat_interval, heartbeat_timeout)


def run(
    main: Callable[[Any, Any], Any],
    args: Any = None,
    backend=None,
    spec: Optional[ClusterSpec] = None,
    *,
    reservation_timeout: Optional[float] = None,
    heartbeat_interval: Optional[float] = None,
    heartbeat_timeout: Optional[float] = None,
    env: Optional[Dict[str, str]] = None,
    default_fs: Optional[str] = None,
    driver_host: Optional[str] = None,
    keep_workdir: bool = False,
    log_to_driver=True,
    log_dir: Optional[str] = None,
    tensorboard: bool = False,
    tensorboard_dir: Optional[str] = None,
    progress=None,
    verbose: bool = False,
    max_restarts: int = 0,
    restart_on=None,
    checkpoint_dir: Optional[str] = None,
) -> Cluster:
    """Run ``main(args, ctx)`` once per node of a TensorFlow cluster; return when all run.

    Parameters
    ----------
    main:
        The node program. It runs in a process of its own on every chief, worker and evaluator
        node, with ``TF_CONFIG`` set; ps nodes run a ``tf.distribute.Server`` instead.
    args:
        Passed to ``main`` as is (pickled with cloudpickle).
    backend:
        A ``SparkSession`` or ``SparkContext``, a ``distributed.Client``, a backend name
        (``"spark"``, ``"dask"``, ``"local"``), a :class:`duotf.backends.Backend`, or None for
        the embedded local backend.
    spec:
        The :class:`ClusterSpec`; default ``ClusterSpec(workers=1)``.
    reservation_timeout:
        Seconds for every node to register and be ready (env ``DUOTF_RESERVATION_TIMEOUT``,
        default 120).
    heartbeat_interval, heartbeat_timeout:
        Seconds between heartbeats, and of silence after which a node counts as dead
        (env ``DUOTF_HEARTBEAT_TIMEOUT``, defaults 1 and 30).
    env:
        Extra environment variables for the node processes.
    default_fs:
        The filesystem that ``ctx.absolute_path`` resolves against; default: Spark's
        ``fs.defaultFS``, else ``file://``.
    driver_host:
        The driver's address as the executors reach it; default: the backend's own view.
    keep_workdir:
        Keep each node's working directory (``ctx.working_dir``) after its process ends; by
        default it is removed with the node. Save what matters under paths you choose.
    log_to_driver:
        Whose stdout and stderr (C/C++ output and Python ``logging`` to a stream included) go
        to the driver as they are written: ``True`` every node's, ``"chief"`` the chief's
        (``worker:0`` without a chief), ``False`` none (it stays in the engine's task logs).
        On the driver each line goes to the ``duotf.node`` logger at INFO as
        ``[worker:1] line``, to a file per node (:meth:`Cluster.logs`), and into a failed
        node's :class:`~duotf.errors.NodeFailedError`. TensorFlow's C++ INFO notes are hidden
        on every node unless ``env={"TF_CPP_MIN_LOG_LEVEL": "0"}``.
    log_dir:
        Keep the nodes' output files in ``<log_dir>/<job id>/``; by default they go to a
        temporary directory removed with the :class:`Cluster` object.
    tensorboard:
        Start TensorBoard beside the chief (or ``worker:0``), reading ``ctx.log_dir``, on a
        free port of that host: :attr:`Cluster.tensorboard_url` gives its address. It stops
        with the cluster. Needs the ``tensorboard`` package where the nodes run.
    tensorboard_dir:
        Where the nodes' ``ctx.log_dir`` is: ``<tensorboard_dir>/<job id>``, a path every node
        can write (made absolute here) or a URL TensorFlow writes (``hdfs://``, ``gs://``), and
        kept. By default a directory of the job's under each node host's temp directory,
        removed with the nodes (TensorBoard shows what the chief's host holds).
    progress:
        The progress bars of :meth:`Cluster.train` (one per epoch: rows fed of the epoch's
        rows, rows/s, the latest values of ``ctx.report``) and :meth:`Cluster.inference`
        (tqdm; ``tqdm.auto`` in Jupyter): ``None`` (default) shows them when stderr is a
        terminal or in a notebook, ``True`` always (on stderr), ``False`` never, and a
        file-like object writes them there.
    verbose:
        ``True`` shows what duotf hides by default, from now on in this process
        (:func:`duotf.set_verbose`): the nodes' TensorFlow C++ INFO notes
        (``TF_CPP_MIN_LOG_LEVEL=0`` unless ``env`` sets it), the engines' known notices (pyspark's
        pandas-version FutureWarning), and duotf's own log records at INFO on stderr where no
        logging handler of yours shows them. ``False`` leaves the setting as it is.
    max_restarts:
        How many times the cluster is restarted after a node fails (as Ray Train's
        ``FailureConfig(max_failures=...)``): every node is stopped, the gang starts again
        (a new engine job, new ports and ``TF_CONFIG``; lost executors or workers are waited
        for up to ``reservation_timeout``), ``main`` runs again with ``ctx.attempt`` set, and
        a :meth:`Cluster.train` in progress feeds the restarted nodes from
        ``ctx.resume_epoch`` on, the last epoch every node reported a checkpoint of
        (``ctx.report_checkpoint``). ``cluster.restarts`` lists each restart. Default 0:
        the first failure is raised.
    restart_on:
        Which failures restart: causes among ``"killed"`` (a signal), ``"exited"`` (the node
        process exited before main returned), ``"lost"`` (its engine task, executor or worker
        went away), ``"hung"`` (no heartbeat for ``heartbeat_timeout``) and ``"exception"``
        (main raised), and exception classes (or names) of main's to restart on. Default: all
        but ``"exception"``, which is usually a bug that a restart would repeat.
    checkpoint_dir:
        Where ``ctx.checkpoint_dir`` is: ``<checkpoint_dir>/<job id>``, a path every node can
        write (made absolute here) or a URL (``hdfs://``, ``s3://``), kept after shutdown.
        By default a directory on the driver's host, removed at shutdown: enough where every
        node runs on that host; a cluster of several hosts needs a shared location.

    Returns
    -------
    Cluster
        Call ``wait()`` for the values of ``main`` and ``shutdown()`` at the end, or use it as
        a context manager.
    """
    spec, (reservation_timeout, heartbeat_interval, heartbeat_timeout) = check_run_arguments(
        main, spec, reservation_timeout, heartbeat_interval, heartbeat_timeout)
    if verbose:
        set_verbose(True)
    env = node_env(env or {})
    backend_obj, owns = resolve_backend(backend)
    try:
        cluster = Cluster(
            main, args, backend_obj, spec,
            reservation_timeout=reservation_timeout,
            heartbeat_interval=heartbeat_interval,
            heartbeat_timeout=heartbeat_timeout,
            env=env,
            default_fs=default_fs,
            driver_host=driver_host,
            owns_backend=owns,
            keep_workdir=keep_workdir,
            log_to_driver=log_to_driver,
            log_dir=log_dir,
            tensorboard=tensorboard,
            tensorboard_dir=tensorboard_dir,
            progress=progress,
            max_restarts=max_restarts,
            restart_on=restart_on,
            checkpoint_dir=checkpoint_dir,
        )
    except BaseException:
        if owns:
            backend_obj.close()
        raise
    return cluster.start()  # a start that fails shuts the cluster down
