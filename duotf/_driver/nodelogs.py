"""The nodes' output on the driver: a file per node, its last lines, and the ``duotf.node`` logger.

Each node's stdout and stderr (Python's and C/C++'s alike, Python ``logging`` to a stream
included) arrive over the authenticated rendezvous channel (see :mod:`duotf._node.output` for the
node's end, its line cut and rate limit). The :class:`NodeLogs` of a cluster

* appends every line to ``<role>-<index>.log`` in its directory (``cluster.log_dir``): a
  private temporary directory, removed when the :class:`~duotf.Cluster` object is collected or
  the interpreter exits, or ``<log_dir>/<job id>/`` when ``run(log_dir=...)`` names one, which
  is never removed;
* keeps each node's last :data:`TAIL_LINES` lines for :class:`~duotf.errors.NodeFailedError`;
* shows every line as ``[worker:1] line``, and the count of lines a node's rate limit dropped:
  through ``logging.getLogger("duotf.node")`` (at INFO, the count at WARNING; a record's
  ``duotf_node`` and ``duotf_role`` attributes say whose) where the user configured logging,
  else on the console (below).

Shown by default, as Ray Train and TorchDistributor show a worker's output: where no logging
handler of the user's would show the ``duotf.node`` records (none on ``duotf.node``, ``duotf``
or the root logger), NodeLogs writes each line, prefixed, itself: to ``sys.stderr`` in a script
(its stdout may be data), to ``sys.stdout`` in an interactive session (a REPL or a Jupyter
kernel). Where the user configured a handler, the records go only through logging, which then
decides (``logging.basicConfig(level=logging.INFO)`` shows them), so nothing is shown twice.
``log_to_driver=False`` sends nothing here at all.
"""

from __future__ import annotations

import collections
import logging
import os
import shutil
import sys
import tempfile
import threading
from typing import IO, Dict, List, Optional, Sequence

from duotf._node.output import BYTE_RATE, LINE_RATE
from duotf.errors import ConfigError
from duotf.spec import Job

__all__ = ["NodeLogs", "log_node_ids", "TAIL_LINES"]

logger = logging.getLogger("duotf.node")

#: lines of a node's output that a NodeFailedError carries
TAIL_LINES = 100


def log_node_ids(roles: Sequence, log_to_driver) -> frozenset:
    """The node ids whose output goes to the driver: all (``True``), the chief's only
    (``"chief"``: the ``chief`` node, or ``worker:0`` where there is none), or none (``False``)."""
    if log_to_driver is True:
        return frozenset(range(len(roles)))
    if log_to_driver is False:
        return frozenset()
    if log_to_driver == "chief":
        chief = Job.CHIEF if any(r.job is Job.CHIEF for r in roles) else Job.WORKER
        return frozenset(i for i, r in enumerate(roles) if r.job is chief and r.index == 0)
    raise ConfigError(f"log_to_driver={log_to_driver!r}: give True (every node's output), "
                      "'chief' (the chief's only) or False (none: it stays in the engine's task logs)")


def _interactive() -> bool:
    return hasattr(sys, "ps1") or bool(sys.flags.interactive) or "ipykernel" in sys.modules


def _user_handlers() -> bool:
    """Whether a logging handler of the user's is on the way of a ``duotf.node`` record (duotf's
    own, flagged ``duotf_own``, as :mod:`duotf._verbosity`'s, do not count)."""
    log: Optional[logging.Logger] = logger
    while log is not None:
        if any(not getattr(h, "duotf_own", False) for h in log.handlers):
            return True
        log = log.parent if log.propagate else None
    return False


def _echo(lines: List[str]) -> None:
    """Write ``lines`` where the person who started the job sees them (the stream of the
    moment: a notebook swaps it per cell)."""
    stream = sys.stdout if _interactive() else sys.stderr
    try:
        stream.write("".join(line + "\n" for line in lines))
        stream.flush()
    except (OSError, ValueError, AttributeError):
        pass  # a closed or missing stream: the lines are still in the node's file


class NodeLogs:
    """The output of a cluster's nodes, as it arrives. Thread-safe.

    Parameters
    ----------
    roles:
        Every node's role, by node id (the lines' prefix, the files' names).
    job_id:
        The cluster's job id.
    log_dir:
        Where the files go (``<log_dir>/<job_id>/``, kept); None: a temporary directory, removed
        by :meth:`remove`.
    """

    def __init__(self, roles: Sequence, job_id: str, log_dir: Optional[str] = None):
        self.roles = [str(r) for r in roles]
        if log_dir is None:
            self.directory = tempfile.mkdtemp(prefix=f"duotf-logs-{job_id}-")
            self.owned = True
        else:
            self.directory = os.path.join(os.fspath(log_dir), job_id)
            os.makedirs(self.directory, exist_ok=True)
            self.owned = False
        self._files: Dict[int, IO[str]] = {}
        self._tails: List[collections.deque] = [collections.deque(maxlen=TAIL_LINES) for _ in self.roles]
        self._lock = threading.Lock()
        self._closed = False

    def path(self, node_id: int) -> str:
        return os.path.join(self.directory, self.roles[node_id].replace(":", "-") + ".log")

    def add(self, node_id: int, lines: List[str], dropped: int = 0) -> None:
        """Record a batch of node ``node_id``'s output: ``dropped`` lines were lost just before."""
        role = self.roles[node_id]
        note = None
        if dropped:
            note = (f"{dropped} lines dropped (a node sends at most {LINE_RATE} lines/s and "
                    f"{BYTE_RATE >> 10} KiB/s to the driver)")
        with self._lock:
            if self._closed:
                return
            f = self._files.get(node_id)
            if f is None:
                f = self._files[node_id] = open(self.path(node_id), "a", encoding="utf-8",
                                                errors="replace")
            if note is not None:
                f.write(f"[duotf: {note}]\n")
                self._tails[node_id].append(f"[duotf: {note}]")
            for line in lines:
                f.write(line + "\n")
            f.flush()
            self._tails[node_id].extend(lines)
        # Outside the lock: a handler may be slow, and only this node's connection waits on it.
        if not _user_handlers():
            _echo(([f"[{role}] {note}"] if note is not None else [])
                  + [f"[{role}] {line}" for line in lines])
            return
        extra = {"duotf_node": node_id, "duotf_role": role}
        if note is not None:
            logger.warning("[%s] %s", role, note, extra=extra)
        if logger.isEnabledFor(logging.INFO):
            for line in lines:
                logger.info("[%s] %s", role, line, extra=extra)

    def tail(self, node_id: int) -> List[str]:
        """The last :data:`TAIL_LINES` lines of node ``node_id``'s output so far."""
        with self._lock:
            return list(self._tails[node_id])

    def text(self, node_id: int) -> str:
        """Everything node ``node_id`` wrote so far ('' when nothing, or its file is gone)."""
        with self._lock:
            f = self._files.get(node_id)
            if f is not None and not self._closed:
                f.flush()
        try:
            with open(self.path(node_id), encoding="utf-8", errors="replace") as f:
                return f.read()
        except FileNotFoundError:
            return ""

    def close(self) -> None:
        """Close the files (later lines are ignored); they stay readable."""
        with self._lock:
            self._closed = True
            files, self._files = list(self._files.values()), {}
        for f in files:
            f.close()

    def remove(self) -> None:
        """:meth:`close`, and remove the directory where it is a temporary one."""
        self.close()
        if self.owned:
            shutil.rmtree(self.directory, ignore_errors=True)
