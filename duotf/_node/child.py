"""Entry point of a node process: ``python -m duotf._node.child READ_FD WRITE_FD``.

Spawned by the agent (:mod:`duotf._node.agent`) with two pipes. Everything on them is pickled between
the agent and its own child, never over a network socket. The process:

1. receives the job (a :class:`duotf._node.agent.ChildJob`: pickled ``main`` and ``args``, and
   this node's part) and heartbeats to the agent;
2. checks that TensorFlow can serve the protocol, before any user code, and says "ready";
3. waits for "start" (TF_CONFIG of the whole cluster), then runs ``main(args, ctx)`` - or, on a
   ps node, a ``tf.distribute.Server`` until stopped;
4. sends the pickled return value, or the exception and its traceback;
5. after a return, keeps its TF server up until "release" (every node's main returned), then
   exits.

It exits at once when the agent goes away (pipe closed), and kills its own process group when
the agent falls silent (no ping for ``heartbeat_timeout``: its engine task was stopped or
stalled), so no node outlives its supervision. The messages on the pipe are the
:class:`duotf._node.agent.ChildMsg` kinds; its exit codes are :class:`duotf._node.agent.ChildExit`.
"""

from __future__ import annotations

import logging
import os
import select
import signal
import sys
import threading
import time
import traceback
from multiprocessing.connection import Connection
from typing import Optional

# already imported with the package: costs nothing here
from duotf._node import job as job_payload
from duotf._node.agent import ChildExit, ChildJob, ChildMsg, remove_workdir
from duotf._node.output import quiet_keras_notices


class _Link:
    def __init__(self, rfd: int, wfd: int):
        self.rx = Connection(rfd, readable=True, writable=False)
        self.tx = Connection(wfd, readable=False, writable=True)
        self._lock = threading.Lock()

    def send(self, *message) -> None:
        with self._lock:
            self.tx.send(message)


def _orphaned(job: ChildJob, group: bool = False) -> None:
    """End this node process, its agent gone or silent: remove its working directory first (the
    agent, which would have, cannot any more, and the driver may be on another host: this
    process is the last that knows the folder), then exit; ``group``: with every process of
    its process group (the node's own subprocesses)."""
    if not job.keep_workdir:
        try:
            os.chdir("/")  # the folder is this process's own working directory
            remove_workdir(os.path.dirname(job.working_dir), job.node_id,
                           job.log_dir if job.owns_log_dir else None)
        except BaseException:  # leaving is what matters now; a folder left is the lesser harm
            pass
    if group and os.getpgrp() == os.getpid():  # the agent started this node in a session of its own
        os.killpg(os.getpid(), signal.SIGKILL)
    os._exit(ChildExit.FAILED)


def _heartbeat(link: _Link, job: ChildJob) -> None:
    interval = job.heartbeat_interval
    while True:
        try:
            link.send(ChildMsg.HEARTBEAT)
        except OSError:
            _orphaned(job)
        threading.Event().wait(interval)


def _reader(link: _Link, job: ChildJob, inbox: list, arrived: threading.Condition,
            heard: list) -> None:
    while True:
        try:
            message = link.rx.recv()
        except (EOFError, OSError):
            # The agent is gone: nobody supervises this node any more.
            _orphaned(job)
        heard[0] = time.monotonic()
        if message[0] is ChildMsg.PING:
            continue
        with arrived:
            inbox.append(message)
            arrived.notify_all()


def _watchdog(heard: list, job: ChildJob, tick: float) -> None:
    """End this node (its whole process group) once the agent has said nothing for
    ``timeout`` seconds: the engine task that supervises it is stopped or stalled, and the
    driver has given the node up (it did after the same silence)."""
    timeout = job.heartbeat_timeout
    last_tick = time.monotonic()
    while True:
        threading.Event().wait(tick)
        now = time.monotonic()
        if now - last_tick > tick + timeout / 2:
            # This process itself did not run for a while (stopped, or a C call held the
            # interpreter): pings may wait unread in the pipe. Count the silence afresh.
            heard[0] = now
        last_tick = now
        silent = now - heard[0]
        if silent > timeout:
            try:
                # fd 2 may be a pipe to the stalled agent, full: say why only if it has room
                if select.select([], [2], [], 0)[1]:
                    os.write(2, f"duotf: node process {os.getpid()}: no word from its agent for "
                                f"{silent:.1f} s (heartbeat_timeout={timeout:g}); exiting\n".encode())
            except (OSError, ValueError):
                pass
            _orphaned(job, group=True)


def _wait_for(inbox: list, arrived: threading.Condition, kind: ChildMsg):
    """The first message of ``kind`` from the agent; waits as long as the agent lives."""
    with arrived:
        while True:
            for i, message in enumerate(inbox):
                if message[0] is kind:
                    return inbox.pop(i)
            arrived.wait()


def _error_info(exc: BaseException, kind: str = "exception") -> dict:
    return {
        "kind": kind,
        "remote_type": type(exc).__name__,
        "message": str(exc),
        "traceback": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
    }


def check_protocol(protocol: str):
    """Return None when TensorFlow can serve ``protocol``, else an error dict."""
    import tensorflow as tf

    try:
        tf.distribute.Server(
            tf.train.ClusterSpec({"duotf_check": ["localhost:0"]}),
            job_name="duotf_check",
            task_index=0,
            protocol=protocol,
            start=False,
        )
    except tf.errors.NotFoundError as exc:
        info = _error_info(exc, kind="protocol")
        info["tf_version"] = tf.__version__
        info["message"] = str(exc).splitlines()[0]
        return info
    return None


def _notify(link: _Link, what: str) -> None:
    what = ChildMsg(what)
    if what is ChildMsg.SERVING and threading.current_thread() is threading.main_thread():
        # A server blocks in C code where no Python handler runs; it has nothing to save.
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    link.send(what)


def _on_sigterm(signum, frame):
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second request ends the process outright
    raise SystemExit(f"stopped by duotf (signal {signum})")


def _start_threads(link: _Link, job: ChildJob, inbox: list, arrived: threading.Condition):
    """Start what runs beside ``main``: the heartbeat, TensorBoard (if this node starts it), the
    feed server, the reporter, the reader of the agent's messages and its watchdog. Returns
    ``(feed, reporter)``."""
    global _tensorboard
    threading.Thread(target=_heartbeat, args=(link, job), daemon=True).start()
    if job.tensorboard:
        # Started first: its seconds of start-up overlap this node's own (TensorFlow's import).
        from duotf._node.tensorboard import TensorBoard

        _tensorboard = TensorBoard(job.log_dir, lambda info: link.send(ChildMsg.TENSORBOARD, info))
        _tensorboard.start()
    from duotf._transport.server import FeedServer

    feed = FeedServer(job.secret, on_terminate=lambda: link.send(ChildMsg.FEED_TERMINATED),
                      on_failure=lambda info: link.send(ChildMsg.FEED_FAILED, info), tls=job.tls)
    from duotf._node.reports import Reporter

    reporter = Reporter(lambda payload: link.send(ChildMsg.REPORT, payload))
    heard = [time.monotonic()]
    threading.Thread(target=_reader, args=(link, job, inbox, arrived, heard), daemon=True).start()
    timeout = job.heartbeat_timeout
    if timeout:
        tick = min(job.heartbeat_interval, timeout / 4)
        threading.Thread(target=_watchdog, args=(heard, job, tick), daemon=True).start()
    return feed, reporter


def _refusal(link: _Link, job: ChildJob) -> Optional[ChildExit]:
    """Say why this node cannot run here (its GPUs, its protocol) and return the exit code that
    goes with it; None when it can."""
    if job.gpu_error:
        link.send(ChildMsg.ERROR, {"kind": "gpus", "remote_type": "ConfigError",
                                   "message": job.gpu_error, "traceback": ""})
        return ChildExit.GPUS
    if job.protocol != "grpc":
        error = check_protocol(job.protocol)
        if error is not None:
            link.send(ChildMsg.ERROR, error)
            return ChildExit.PROTOCOL
    return None


def _node_context(link: _Link, job: ChildJob, start: dict, feed, reporter):
    """This node's :class:`~duotf.context.NodeContext`, once the driver's ``start`` came; exports
    TF_CONFIG and enters the node's working directory."""
    os.environ["TF_CONFIG"] = _json(start["tf_config"])
    from duotf.context import node_context

    os.makedirs(job.working_dir, exist_ok=True)
    os.chdir(job.working_dir)
    return node_context(
        node_id=job.node_id,
        job_name=start["job"],
        task_index=start["index"],
        tf_config=start["tf_config"],
        working_dir=job.working_dir,
        log_dir=job.log_dir,
        default_fs=job.default_fs,
        protocol=job.protocol,
        host=start["host"],
        port=start["port"],
        job_id=job.job_id,
        executor_id=job.executor_id,
        gpus=job.gpus or [],
        notify=lambda what: _notify(link, what),
        feed_server=feed,
        reporter=reporter,
        attempt=job.attempt,
        resume_epoch=job.resume_epoch,
        checkpoint_dir=job.checkpoint_dir,
        checkpoint=job.checkpoint,
        on_checkpoint=lambda info: link.send(ChildMsg.CHECKPOINT, info),
    )


def make_checkpoint_dir(where: str) -> None:
    """Make the user's ``ctx.checkpoint_dir`` (``<checkpoint_dir>/<job id>``) before main runs,
    so main can save into it at once. Every node makes it: a path names a folder of each node's
    own host (a shared mount, or a local one that serves restarts on that host). A URL's folder
    is made through fsspec where the filesystem has folders (hdfs://, file://); object stores
    (s3://, gs://) have none to make, and a URL whose folder cannot be made is left to main."""
    if "://" in where:
        try:
            from duotf.io.files import filesystem

            fs, path = filesystem(where)
            fs.makedirs(path, exist_ok=True)
        except Exception as exc:  # best effort: main's own writes say what is wrong, if anything
            logging.getLogger(__name__).warning(
                "duotf: could not make checkpoint_dir %s (%s); main writes into it as it is",
                where, exc)
        return
    try:
        os.makedirs(where, exist_ok=True)
    except OSError as exc:
        from duotf.errors import ConfigError

        raise ConfigError(
            f"checkpoint_dir: cannot make {where} on this node: {exc}. Give duotf.run("
            "checkpoint_dir=...) a folder that every node can write (a shared path or a URL)"
        ) from exc


def _run_main(link: _Link, job: ChildJob, reporter, user_main, user_args, ctx) -> ChildExit:
    """Run ``main(args, ctx)`` and send what came of it: its pickled value (``OK``), or the
    error that ended it (``FAILED``)."""
    from duotf.context import check_feeds_answered

    link.send(ChildMsg.RUNNING)
    try:
        try:
            if job.make_checkpoint_dir and job.checkpoint_dir:
                make_checkpoint_dir(job.checkpoint_dir)
            value = user_main(user_args, ctx)
            check_feeds_answered(ctx)
        finally:
            # what main reported goes before how it ended (its agent reads the pipe at once)
            reporter.flush(_REPORT_GRACE)
    except SystemExit as exc:
        if exc.code not in (None, 0):
            link.send(ChildMsg.ERROR, _error_info(exc))
            return ChildExit.FAILED
        value = None
    except BaseException as exc:
        link.send(ChildMsg.ERROR, _error_info(exc))
        return ChildExit.FAILED
    try:
        import cloudpickle

        payload = cloudpickle.dumps(value)
    except BaseException as exc:
        link.send(ChildMsg.ERROR, _error_info(exc, kind="result"))
        return ChildExit.FAILED
    link.send(ChildMsg.RESULT, payload)
    return ChildExit.OK


def main(argv) -> ChildExit:
    """Run the node the agent describes on the pipes ``argv[1]`` (read) and ``argv[2]`` (write);
    returns the process's exit code."""
    from duotf._transport import malloc
    malloc.tune()
    from duotf import keras as keras_fix  # no Keras import: a hook for when main imports it

    keras_fix.install()
    quiet_keras_notices()
    link = _Link(int(argv[1]), int(argv[2]))
    job: ChildJob = link.rx.recv()[1]  # (ChildMsg.INIT, ChildJob(...))
    if job.output_captured:
        # fd 1 is a pipe to the agent: a line reaches the driver when it is printed, not when
        # a block buffer fills (stderr is line-buffered already)
        sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]  # a TextIOWrapper
    inbox: list = []
    arrived = threading.Condition()
    feed, reporter = _start_threads(link, job, inbox, arrived)
    # A stop request turns into SystemExit in main, so `finally` blocks and context managers run.
    signal.signal(signal.SIGTERM, _on_sigterm)

    refused = _refusal(link, job)
    if refused is not None:
        return refused
    try:
        user_main, user_args = job_payload.loads(job.payload)
    except BaseException as exc:  # the job cannot even be loaded here: say why
        info = _error_info(exc, kind="load")
        if isinstance(exc, ModuleNotFoundError) and exc.name:
            info["message"] += (
                f": the job's main or its arguments use the module {exc.name!r}, which this "
                "node's Python cannot import. Install it where the nodes run, or have the "
                "job carry its code: on the driver, after importing it, call "
                f"cloudpickle.register_pickle_by_value({exc.name.split('.')[0]}) (a one-file "
                "module beside the script that the driver runs is carried by itself)")
        link.send(ChildMsg.ERROR, info)
        return ChildExit.LOAD
    if _tensorboard is not None:
        # Ready once TensorBoard serves (or failed): its address reaches the driver before this
        # node is ready, so duotf.run returns with cluster.tensorboard_url known. Its start-up
        # ran beside this process's own; a TensorBoard that says nothing is not waited for long.
        _tensorboard.wait(TENSORBOARD_WAIT)
    link.send(ChildMsg.READY, {"feed_port": feed.port})

    start = _wait_for(inbox, arrived, ChildMsg.START)[1]
    ctx = _node_context(link, job, start, feed, reporter)
    if start["job"] == "ps":  # the driver's message is JSON: the role is its plain string
        ctx.serve()  # a ps node only serves, until it is stopped
        return ChildExit.OK
    code = _run_main(link, job, reporter, user_main, user_args, ctx)
    if code is not ChildExit.OK:
        return code
    # Stay up (and so keep this node's TF server up) until every node's main has returned, for
    # as long as that takes: a peer may still be receiving this node's part of the last
    # collective. Should the agent go away instead, the reader thread ends this process.
    _wait_for(inbox, arrived, ChildMsg.RELEASE)
    return ChildExit.OK


#: the TensorBoard this node process started (duotf.run(..., tensorboard=True)), if any
_tensorboard = None
#: seconds a node waits for its TensorBoard to serve before it says it is ready without it
TENSORBOARD_WAIT = 60.0
#: seconds main's last reports are given to reach the agent before its end is said
_REPORT_GRACE = 5.0


def _json(obj) -> str:
    import json

    return json.dumps(obj)


def run(argv) -> int:
    """Run a node process to its end (:func:`main`, then its atexit handlers and TensorBoard's
    stop) and return its exit code, for ``os._exit``: the entry point of a spawned node, and of
    one forked warm (:mod:`duotf._node.warm`)."""
    import atexit

    try:
        code = main(argv)
    except SystemExit:  # stopped (SIGTERM) before main ran, e.g. while a ps imported TF
        code = ChildExit.FAILED
    # Run the user's atexit handlers (summary writers, ...), then skip the interpreter teardown:
    # TF's thread pools can take seconds to wind down and nothing is left to save.
    atexit._run_exitfuncs()
    if _tensorboard is not None:  # after the user's writers flushed
        _tensorboard.stop()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # the pipe to a lost agent
            pass
    return int(code)


if __name__ == "__main__":
    os._exit(run(sys.argv))
