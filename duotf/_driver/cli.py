"""The command line: ``python -m duotf doctor`` and ``python -m duotf run`` (or ``duotf ...``).

``doctor`` prints :func:`duotf.doctor`'s table and exits 1 when a check failed. ``run`` runs
``package.module:main`` (or a script file, ``train.py``: :mod:`duotf._node.script`) as
:func:`duotf.run` would from a driver script, shows the nodes' output
on stderr as it is written (the ``duotf.node`` logger), prints the values of ``main`` as JSON on
stdout, and exits 1 with the error's message when duotf raised. The engine is
``--spark-master URL`` (``sc://HOST:PORT``: a Spark Connect server), ``--dask-scheduler ADDR``
or ``--backend NAME`` (default ``local``);
``--backend spark`` without a master takes the active session or makes one from what
``spark-submit`` set, never from a SparkConf read before a context exists.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import logging
import os
import sys
from typing import List, Optional

from duotf.errors import ConfigError, DuotfError

__all__ = ["main"]


def _spec_options(parser: argparse.ArgumentParser, workers: int) -> None:
    group = parser.add_argument_group("the TensorFlow cluster")
    group.add_argument("--workers", type=int, default=workers, help=f"worker nodes (default {workers})")
    group.add_argument("--ps", type=int, default=0, help="parameter servers (default 0)")
    group.add_argument("--chief", action="store_true", help="add a chief node")
    group.add_argument("--evaluator", action="store_true", help="add an evaluator node")
    group.add_argument("--protocol", default="grpc", help="the TF server protocol (default grpc)")


def _engine_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("the engine (one of)")
    group.add_argument("--backend", default=None,
                       help="a backend name: local (default), spark, dask, or a plugin's")
    group.add_argument("--spark-master", metavar="URL",
                       help="start a Spark session on this master (spark://..., yarn, local[N]), "
                            "or connect to this Spark Connect server (sc://HOST:PORT)")
    group.add_argument("--dask-scheduler", metavar="ADDR",
                       help="connect a distributed.Client to this scheduler (tcp://host:8786)")
    group.add_argument("--env", action="append", default=[], metavar="K=V",
                       help="an environment variable for the node processes (repeatable)")
    group.add_argument("--driver-host", default=None,
                       help="the driver's address as the executors reach it")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="duotf", description="Distributed TensorFlow on Spark and Dask.")
    commands = parser.add_subparsers(dest="command", required=True)

    check = commands.add_parser(
        "doctor", help="check that a cluster can run duotf, and say what to fix",
        description="Check slots, versions, TensorFlow's protocol, the driver's and the nodes' "
                    "ports, the filesystem and /dev/shm from every executor; exit 1 on a FAIL.")
    _engine_options(check)
    _spec_options(check, workers=1)
    check.add_argument("--url", default=None,
                       help="a folder every node must write and read (default: the default filesystem)")
    check.add_argument("--reach", action="append", default=[], metavar="HOST:PORT",
                       help="an address every executor must reach (repeatable)")
    check.add_argument("--timeout", type=float, default=180.0, help="seconds for all checks (default 180)")
    check.set_defaults(handler=_doctor)

    run = commands.add_parser(
        "run", help="run package.module:main on a cluster, without a driver script",
        description="Run main(args, ctx), or a script, on every node; args is the list of "
                    "strings after '--'. "
                    "Prints main's values (by node id) as JSON on stdout.",
        usage="duotf run package.module:main|SCRIPT.py [options] [-- args...]")
    run.add_argument("target", metavar="package.module:main|SCRIPT.py",
                     help="a function main(args, ctx), or a script file: its main(args, ctx) if "
                          "it defines one, else the whole script with sys.argv = [script, args...]")
    _engine_options(run)
    _spec_options(run, workers=1)
    run.add_argument("--log-dir", default=None, help="keep each node's output file under this folder")
    run.add_argument("--quiet", action="store_true", help="do not show the nodes' output")
    run.set_defaults(handler=_run)
    return parser


def _env(pairs: List[str]) -> dict:
    env = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"--env {pair!r}: give K=V")
        env[key] = value
    return env


def _spec(args):
    from duotf.spec import ClusterSpec

    return ClusterSpec(workers=args.workers, ps=args.ps, chief=args.chief,
                       evaluator=args.evaluator, protocol=args.protocol)


@contextlib.contextmanager
def _engine(args):
    """What to pass as ``backend``, and the engine handle this command made (closed after)."""
    if args.spark_master and args.dask_scheduler or (
            args.spark_master and args.backend not in (None, "spark")) or (
            args.dask_scheduler and args.backend not in (None, "dask")):
        raise ConfigError("give one engine: --spark-master, --dask-scheduler or --backend")
    if args.spark_master:
        from pyspark.sql import SparkSession

        builder = SparkSession.builder
        if args.spark_master.startswith("sc://"):  # a Spark Connect server
            session = builder.remote(args.spark_master).getOrCreate()
        else:
            session = builder.master(args.spark_master).appName("duotf").getOrCreate()
        try:
            yield session
        finally:
            session.stop()
    elif args.dask_scheduler:
        from distributed import Client

        with Client(args.dask_scheduler) as client:
            yield client
    else:
        yield args.backend or "local"


def _doctor(args) -> int:
    from duotf._driver.doctor import Check, CheckStatus, DoctorReport, doctor, java_check

    spec = _spec(args)
    if args.spark_master and not args.spark_master.startswith("sc://") or (
            args.backend == "spark" and not os.environ.get("SPARK_REMOTE")):
        java = java_check()  # a Connect client needs no JVM here
        if java.status is CheckStatus.FAIL:  # no JVM: no session to start
            report = DoctorReport(f"spark ({args.spark_master or 'spark-submit'})", spec, [java])
            print(report.table())
            return 1
    try:
        with _engine(args) as backend:
            report = doctor(backend, spec, url=args.url, reach=args.reach, env=_env(args.env),
                            driver_host=args.driver_host, timeout=args.timeout)
    except DuotfError:
        raise
    except Exception as exc:  # the engine did not start (a wrong master, no scheduler there)
        where = args.spark_master or args.dask_scheduler or args.backend
        report = DoctorReport(str(where), spec, [Check(
            "backend", CheckStatus.FAIL, f"cannot start the engine at {where}: "
            f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}",
            "check the address, and that this machine reaches it")])
    print(report.table())
    return 0 if report.ok else 1


def load_main(target: str):
    """``package.module:function`` imported (the current folder first, as ``python -m`` does);
    its module is pickled by value, so the executors need only the packages it imports. A
    ``.py`` file instead: its source, run on every node (:mod:`duotf._node.script`)."""
    if target.endswith(".py"):
        return _script(target)
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(f"{target!r}: name the main as package.module:function")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"cannot import {module_name!r} for {target}: {exc}") from exc
    value = module
    for part in attr.split("."):
        if not hasattr(value, part):
            raise ConfigError(f"{module_name} has no {attr!r} (from {target})")
        value = getattr(value, part)
    if not callable(value):
        raise ConfigError(f"{target} is a {type(value).__name__}, not a main(args, ctx)")
    import cloudpickle

    cloudpickle.register_pickle_by_value(module)
    return value


def _script(path: str):
    from duotf._node.script import ScriptMain, defines_main

    try:
        with open(path, encoding="utf-8") as f:
            source = f.read()
    except OSError as exc:
        raise ConfigError(f"cannot read the script {path!r}: {exc.strerror or exc}") from None
    try:
        has_main = defines_main(source, path)
    except SyntaxError as exc:
        raise ConfigError(f"{path}, line {exc.lineno}: {exc.msg}: the script does not compile") from None
    return ScriptMain(os.path.abspath(path), source, has_main, argv0=path)


def _jsonable(value):
    for convert in ("tolist", "item"):  # numpy arrays and scalars
        if hasattr(value, convert):
            return getattr(value, convert)()
    return repr(value)


def _run(args, main_args: List[str]) -> int:
    from duotf._driver.api import run

    main = load_main(args.target)
    spec = _spec(args)
    with _engine(args) as backend:
        with run(main, list(main_args), backend, spec, env=_env(args.env),
                       driver_host=args.driver_host, log_dir=args.log_dir) as cluster:
            results = cluster.wait()
    sys.stdout.write(json.dumps(results, default=_jsonable) + "\n")
    sys.stdout.flush()
    return 0


def _logging(quiet: bool) -> None:
    """The nodes' output on stderr as it comes (stdout is for the results), and duotf's own
    warnings; nothing else unless the program configured logging itself."""
    if logging.getLogger().handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    for name, level in (("duotf.node", logging.WARNING if quiet else logging.INFO),
                        ("duotf", logging.WARNING)):
        logger = logging.getLogger(name)
        logger.setLevel(level)
        logger.addHandler(handler)
        logger.propagate = False


def main(argv: Optional[List[str]] = None) -> int:
    """The ``duotf`` command; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    main_args: List[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, main_args = argv[:cut], argv[cut + 1:]
    args = _parser().parse_args(argv)
    _logging(getattr(args, "quiet", False))
    try:
        if args.command == "run":
            return _run(args, main_args)
        if main_args:
            raise ConfigError(f"doctor takes no arguments after '--' ({' '.join(main_args)})")
        return args.handler(args)
    except DuotfError as exc:
        sys.stderr.write(f"duotf: error: {exc}\n")
        return 1
    except KeyboardInterrupt:
        return 130
