"""TensorBoard beside a node: started by the node process (:mod:`duotf._node.child`) of the chief (or
worker 0) when ``duotf.run(..., tensorboard=True)``.

It runs as ``python -m tensorboard.main --logdir <ctx.log_dir> --port 0 --bind_all``: the
kernel gives it a free port (with ``DUOTF_PORTS``, a port of that range free when it starts),
which it prints once it listens; that line is the signal that it
serves, and its port goes to the driver (the node's host is known there). TensorBoard runs in
the node process's process group, so everything that ends a node (its agent's stop, the
node's own watchdog, the driver's kill of an unresponsive node) ends it too; the node process
also stops it on its way out. ``--load_fast=false``: TensorBoard reads through TensorFlow's
filesystems (local, ``hdfs://``, ``gs://``, ...), the ones the nodes write with, and starts no
data server process of its own.
"""

from __future__ import annotations

import collections
import os
import re
import subprocess
import sys
import threading
from typing import Callable, Optional

from duotf._transport import ports
from duotf.errors import ConfigError

__all__ = ["TensorBoard"]

_SERVING = re.compile(r"TensorBoard \S+ at https?://\S+?:(\d+)/")
#: lines of TensorBoard's output kept for the error when it does not start
_TAIL = 20


class TensorBoard:
    """A TensorBoard process reading ``log_dir``; ``report(info)`` is called once, from a
    thread of its own, with ``{"port": n}`` once it serves or ``{"error": why}`` if it ends
    before."""

    def __init__(self, log_dir: str, report: Callable[[dict], None]):
        self.log_dir = log_dir
        self._report = report
        self._reported = False
        self._said = threading.Event()
        self.proc: Optional[subprocess.Popen] = None
        self._thread: Optional[threading.Thread] = None

    def start(self) -> None:
        if "://" not in self.log_dir:
            os.makedirs(self.log_dir, exist_ok=True)
        try:  # in DUOTF_PORTS where set (a port free now, which TensorBoard then binds)
            port, _ = ports.free_port(what="TensorBoard")
            bind = ports.bind_address()  # DUOTF_BIND's address, else every interface
        except ConfigError as exc:
            self._say({"error": str(exc)})
            return
        where = ["--host", bind] if bind else ["--bind_all"]
        cmd = [sys.executable, "-m", "tensorboard.main", "--logdir", self.log_dir, "--port", str(port),
               *where, "--load_fast=false"]
        try:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                         stderr=subprocess.STDOUT, close_fds=True)
        except OSError as exc:
            self._say({"error": f"could not start {' '.join(cmd[:3])}: {exc}"})
            return
        self._thread = threading.Thread(target=self._read, name="duotf-tensorboard", daemon=True)
        self._thread.start()

    def _say(self, info: dict) -> None:
        if not self._reported:
            self._reported = True
            self._report(info)
            self._said.set()

    def wait(self, timeout: float) -> bool:
        """Wait until it serves or has failed (reported either way); False after ``timeout``."""
        return self._said.wait(timeout)

    def _read(self) -> None:
        """Wait for the line that says it serves; then keep its pipe drained (a full pipe
        would stall it)."""
        proc = self.proc
        assert proc is not None and proc.stdout is not None  # start() runs this thread after Popen
        tail: collections.deque = collections.deque(maxlen=_TAIL)
        for raw in proc.stdout:
            line = raw.decode(errors="replace").rstrip()
            found = _SERVING.search(line)
            if found and not self._reported:
                self._say({"port": int(found.group(1))})
            elif not self._reported:
                tail.append(line)
        code = proc.wait()
        self._say({"error": f"TensorBoard exited with code {code} before it served:\n"
                            + "\n".join(tail)})

    def stop(self, timeout: float = 5.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout``; returns once it is gone. Idempotent."""
        proc = self.proc
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self._thread is not None:
            self._thread.join(timeout)
        if proc.stdout is not None:
            proc.stdout.close()
