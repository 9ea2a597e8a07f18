"""``duotf.run``: start a TensorFlow cluster on an engine."""

from __future__ import annotations

import os
from typing import IO, Any, Callable, Dict, Iterable, Literal, Optional, Tuple, Union

from duotf.backends import resolve_backend
from duotf._driver.cluster import Cluster, start
from duotf.errors import ConfigError
from duotf.spec import seconds
from duotf.spec import ClusterSpec
from duotf._driver.restarts import RestartOn
from duotf._transport.ports import BIND_ENV, PORTS_ENV, configured as configured_ports, parse as parse_ports
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
    backend: Any = None,
    spec: Optional[ClusterSpec] = None,
    *,
    reservation_timeout: Optional[float] = None,
    heartbeat_interval: Optional[float] = None,
    heartbeat_timeout: Optional[float] = None,
    env: Optional[Dict[str, str]] = None,
    default_fs: Optional[str] = None,
    driver_host: Optional[str] = None,
    keep_workdir: bool = False,
    log_to_driver: Union[bool, Literal["chief"]] = True,
    log_dir: Optional[str] = None,
    tensorboard: bool = False,
    tensorboard_dir: Optional[str] = None,
    progress: Union[bool, IO[str], None] = None,
    verbose: bool = False,
    max_restarts: int = 0,
    restart_on: Union[RestartOn, Iterable[RestartOn], None] = None,
    checkpoint_dir: Optional[str] = None,
    ports: Optional[str] = None,
    tls: Optional[bool] = None,
) -> Cluster:
    """Run ``main(args, ctx)`` once per node of a TensorFlow cluster; return when all run.

    Parameters
    ----------
    main:
        The node program, run in a process of its own on every chief, worker and evaluator node
        with ``TF_CONFIG`` set; ps nodes run a ``tf.distribute.Server`` instead.
    args:
        Passed to ``main`` as is (pickled with cloudpickle).
    backend:
        A ``SparkSession`` or ``SparkContext``, a ``distributed.Client``, a backend name
        (``"spark"``, ``"dask"``, ``"local"``), a :class:`duotf.backends.Backend`, or None for
        the embedded local backend.
    spec:
        The :class:`ClusterSpec`; default ``ClusterSpec(workers=1)``.
    reservation_timeout, heartbeat_interval, heartbeat_timeout:
        Seconds for every node to register and be ready, between heartbeats, and of silence
        after which a node counts as dead (env ``DUOTF_RESERVATION_TIMEOUT``,
        ``DUOTF_HEARTBEAT_INTERVAL``, ``DUOTF_HEARTBEAT_TIMEOUT``; defaults 120, 1 and 30).
    env, default_fs:
        Extra environment variables for the node processes, and
        what ``ctx.absolute_path`` resolves against (default ``fs.defaultFS`` or ``file://``).
    driver_host, keep_workdir:
        The driver's address as the executors reach it (default: the backend's own view); keep
        each node's ``ctx.working_dir`` after its process ends (default: removed).
    log_to_driver:
        Whose stdout and stderr (C/C++ output and ``logging`` included) go to the driver as
        written: ``True`` every node's, ``"chief"`` the chief's (else ``worker:0``'s), ``False``
        none (it stays in the task logs). Each line is shown as ``[worker:1] line`` on stderr
        (stdout in a notebook), or only by your logging handler if one shows ``duotf.node``
        (INFO); kept in a file per node (:meth:`Cluster.logs`) and a failed node's error.
    log_dir:
        Keep the nodes' output files in ``<log_dir>/<job id>/`` (default: a temporary folder,
        removed with the :class:`Cluster`).
    tensorboard:
        Start TensorBoard (the ``tensorboard`` package where the nodes run) beside the chief (or
        ``worker:0``), reading ``ctx.log_dir``, until shutdown: :attr:`Cluster.tensorboard_url`.
    tensorboard_dir:
        Where ``ctx.log_dir`` is: ``<tensorboard_dir>/<job id>``, kept, a path every node can write
        (made absolute here) or a URL; default: in each node host's temp directory, removed.
    progress:
        The tqdm bars of :meth:`Cluster.train` (per epoch: rows fed, rows/s, the latest reports)
        and :meth:`Cluster.inference`: ``None`` shows them on a terminal or in a notebook, ``True``
        always (stderr), ``False`` never; a file object gets them.
    verbose:
        ``True`` shows from now on what duotf hides (:func:`duotf.set_verbose`): the nodes'
        TensorFlow and Keras notes (TensorFlow's C++ notes: also ``TF_CPP_MIN_LOG_LEVEL=0``),
        the engines' known notices, duotf's INFO records on stderr.
    max_restarts:
        How many times the whole cluster restarts after a node fails (Ray Train's
        ``FailureConfig(max_failures=...)``): a new engine job, ports and ``TF_CONFIG`` (lost
        executors or workers waited for up to ``reservation_timeout``), ``main`` runs again with
        ``ctx.attempt`` set, a :meth:`Cluster.train` in progress feeds on from ``ctx.resume_epoch``
        (the last epoch every node reported by ``ctx.report_checkpoint``); ``cluster.restarts``. Default 0.
    restart_on:
        Which failures restart: causes among ``"killed"`` (a signal), ``"exited"`` (before main
        returned), ``"lost"`` (its task, executor or worker went away), ``"hung"`` (no heartbeat)
        and ``"exception"`` (main raised), and main's exception classes (or names). Default:
        all causes but ``"exception"``, usually a bug that a restart would repeat.
    checkpoint_dir:
        ``ctx.checkpoint_dir``: ``<checkpoint_dir>/<job id>``, made by each node, kept; a path or URL
        every node can write. Default: the driver's host, removed at shutdown (or when collected).
    ports, tls:
        The ports every duotf server of the job listens on (``"lo-hi"``; env ``DUOTF_PORTS``), and
        TLS on its feed and control channel (env ``DUOTF_TLS``): defaults in docs/cluster.md.

    Returns
    -------
    Cluster
        ``wait()`` gives the values of ``main``; ``shutdown()`` ends it (or use it in ``with``).
    """
    spec, timeouts = check_run_arguments(main, spec, reservation_timeout, heartbeat_interval,
                                         heartbeat_timeout)
    if verbose:
        set_verbose(True)
    return _start(main, args, backend, spec, timeouts, job_ports(node_env(env or {}), ports), dict(
        default_fs=default_fs, driver_host=driver_host, keep_workdir=keep_workdir,
        log_to_driver=log_to_driver, log_dir=log_dir, tensorboard=tensorboard,
        tensorboard_dir=tensorboard_dir, progress=progress, max_restarts=max_restarts,
        restart_on=restart_on, checkpoint_dir=checkpoint_dir, tls=tls))


def job_ports(env: Dict[str, str], ports: Optional[str]) -> Dict[str, str]:
    """The job's ``env`` with the range of ports it listens on (``ports``, else the driver's
    ``DUOTF_PORTS``), checked here, and the driver's ``DUOTF_BIND`` where ``env`` sets none, so
    that its engine tasks and nodes keep to them too."""
    chosen = parse_ports(ports, "ports") or parse_ports(env.get(PORTS_ENV), f"env {PORTS_ENV}") \
        or configured_ports()
    env = {**env, PORTS_ENV: str(chosen)} if chosen is not None else env
    bind = os.environ.get(BIND_ENV)
    return {**env, BIND_ENV: bind} if bind and BIND_ENV not in env else env


def _start(main, args, backend, spec: ClusterSpec, timeouts: Tuple[float, float, float],
           env: Dict[str, str], options: Dict[str, Any]) -> Cluster:
    """Make the cluster on the backend ``backend`` names and start it; a backend made here is
    closed again where the cluster cannot be made (a start that fails shuts the cluster down,
    and with it such a backend)."""
    reservation_timeout, heartbeat_interval, heartbeat_timeout = timeouts
    backend_obj, owns = resolve_backend(backend)
    try:
        cluster = Cluster(main, args, backend_obj, spec, reservation_timeout=reservation_timeout,
                          heartbeat_interval=heartbeat_interval,
                          heartbeat_timeout=heartbeat_timeout, env=env, owns_backend=owns,
                          **options)
    except BaseException:
        if owns:
            backend_obj.close()
        raise
    return start(cluster)
