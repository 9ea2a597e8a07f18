"""The backend contract: the only engine-specific code in duotf.

A backend says how many nodes it can run at once, starts one long-running function per node as
a gang (all or none), and can cancel what it started. Reservation, roles, TF_CONFIG,
supervision and shutdown are written once in :mod:`duotf.cluster` on top of these.
"""

from __future__ import annotations

import abc
import socket
import threading
from typing import Callable, List, Optional

from ..errors import ConfigError, InsufficientSlotsError
from ..node import NodeOutcome

#: ``fn(node_id, executor_id, attempt) -> NodeOutcome``; runs a node to its end.
NodeFunction = Callable[..., NodeOutcome]


class NodeGang(abc.ABC):
    """The engine's handle on the running node functions."""

    @abc.abstractmethod
    def done(self) -> bool:
        """True once every node function has returned (or the engine job failed)."""

    @abc.abstractmethod
    def exception(self) -> Optional[BaseException]:
        """The engine's error once done, else None."""

    @abc.abstractmethod
    def outcomes(self) -> List[NodeOutcome]:
        """The node functions' results once done."""

    @abc.abstractmethod
    def cancel(self) -> None:
        """Cancel whatever still runs; idempotent."""

    def join(self, timeout: Optional[float] = None) -> None:
        """Wait until done (or ``timeout``)."""

    def add_done_callback(self, fn: Callable[[], None]) -> None:
        """Call ``fn()`` once done (at once if already done), so that a waiter need not poll.
        A gang that cannot tell ignores it, and its waiters poll ``done()``."""


class ThreadGang(NodeGang):
    """A gang whose engine call blocks: it runs in a driver thread until the job ends."""

    def __init__(self, call: Callable[[], List[NodeOutcome]], cancel: Callable[[], None], name: str):
        self._call = call
        self._cancel = cancel
        self._result: Optional[List[NodeOutcome]] = None
        self._exc: Optional[BaseException] = None
        self._cancelled = False
        self._callbacks: Optional[List[Callable[[], None]]] = []
        self._lock = threading.Lock()
        self._finished = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"duotf-{name}-gang", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._result = list(self._call())
        except BaseException as exc:  # reported through exception(); the thread must not die loud
            self._exc = exc
        finally:
            self._finished.set()
            with self._lock:
                callbacks, self._callbacks = self._callbacks, None
            for fn in callbacks:
                fn()

    def add_done_callback(self, fn: Callable[[], None]) -> None:
        with self._lock:
            if self._callbacks is not None:
                self._callbacks.append(fn)
                return
        fn()

    def done(self) -> bool:
        return self._finished.is_set()

    def exception(self) -> Optional[BaseException]:
        return self._exc if self.done() else None

    def outcomes(self) -> List[NodeOutcome]:
        self._thread.join()
        return list(self._result or [])

    def cancel(self) -> None:
        if not self._cancelled and not self.done():
            self._cancelled = True
            self._cancel()

    def join(self, timeout: Optional[float] = None) -> None:
        self._thread.join(timeout)


class Backend(abc.ABC):
    """An engine that can run duotf nodes."""

    name: str = "backend"

    @classmethod
    def from_name(cls) -> "Backend":
        """The backend duotf creates when it is asked for by name (and then owns)."""
        return cls()

    @abc.abstractmethod
    def slots(self) -> int:
        """How many nodes can run at once right now."""

    def check_capacity(self, nodes: int) -> None:
        """Raise :class:`InsufficientSlotsError` quickly when ``nodes`` cannot all run at once."""
        available = self.slots()
        if available < nodes:
            raise InsufficientSlotsError(
                f"the cluster needs {nodes} nodes running at once but the {self.name} backend "
                f"has {available} slots. {self.capacity_hint()}",
                needed=nodes, available=available, backend=self.name,
            )

    def capacity_hint(self) -> str:
        return "Ask for fewer nodes or give the backend more capacity."

    @abc.abstractmethod
    def start_nodes(self, fn: NodeFunction, n: int, job_id: str) -> NodeGang:
        """Start ``fn(node_id, executor_id, attempt)`` for node ids ``0..n-1``, all at once."""

    def feed_adapter(self, data, nodes: int):
        """The engine's view of a collection to feed while ``nodes`` node tasks run."""
        raise ConfigError(
            f"the {self.name} backend cannot feed a {type(data).__name__}; "
            + self.feed_hint()
        )

    def feed_hint(self) -> str:
        return ""

    def driver_host(self) -> str:
        """The driver address that the engine's tasks can reach."""
        return "127.0.0.1"

    def default_fs(self) -> str:
        return "file://"

    def close(self) -> None:
        """Release what the backend created (only called on backends duotf created)."""


def routable_ip(target_host: str) -> str:
    """This machine's address on the route to ``target_host`` (no packet is sent)."""
    try:
        infos = socket.getaddrinfo(target_host, 9, socket.AF_INET, socket.SOCK_DGRAM)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(infos[0][4])
            return probe.getsockname()[0]
    except OSError:
        return "127.0.0.1"
