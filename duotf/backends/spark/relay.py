"""A Spark Connect client that the executors cannot reach: the nodes' rendezvous goes through
a relay in the cluster (:mod:`duotf._transport.relay`), polled through Spark.

Whether it is needed is found once per session and client address: one task tries to open a
connection to the driver's rendezvous server (:func:`needs_relay`). ``DUOTF_RELAY=1`` relays
always, ``DUOTF_RELAY=0`` never (a client that the executors reach pays nothing for the check
but that one task).

The hub is started by a one-task job (the task starts it and returns its address, the hub
detached from it); every poll is a one-task ``mapInArrow`` job over one row, about 0.2 s on a
quiet cluster. A poll needs a free task slot: under Spark's default FIFO scheduling it waits
behind the pending tasks of a running feed job, which the tunnel tolerates for ``idle``
seconds (see :meth:`duotf._driver.supervisor.Supervisor.open_route`); the server's
``spark.scheduler.mode=FAIR`` lets polls through at once.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import threading
from typing import Callable, Dict, Optional, Tuple

from duotf._transport.relay import HELLO, Tunnel, exchange_with_hub
from duotf.backends.base import Route, routable_ip

logger = logging.getLogger(__name__)

__all__ = ["SparkRelay", "needs_relay", "relay_setting"]

#: seconds a task waits to connect to the driver when it checks whether it can
REACH_TIMEOUT = 3.0
_reached: Dict[Tuple[int, str], bool] = {}
_lock = threading.Lock()


def relay_setting() -> Optional[bool]:
    """``DUOTF_RELAY``: True (relay always), False (never) or None (unset: duotf checks)."""
    setting = os.environ.get("DUOTF_RELAY", "").strip().lower()
    if setting in ("1", "true", "yes", "on"):
        return True
    if setting in ("0", "false", "no", "off"):
        return False
    return None


def needs_relay(client, address: Tuple[str, int]) -> bool:
    """Whether the executors of ``client`` (a Connect client) cannot open a connection to
    ``address`` (``DUOTF_RELAY`` decides first, when set)."""
    setting = relay_setting()
    if setting is not None:
        return setting
    key = (client.key, address[0])
    with _lock:
        if key not in _reached:
            (error,) = client.spread(_try_connect(address), 1)
            _reached[key] = error is None
            if error is not None:
                logger.info("duotf: the executors cannot reach this client at %s:%d (%s): the "
                            "nodes reach it through a relay in the cluster", address[0],
                            address[1], error)
        return not _reached[key]


def _try_connect(address: Tuple[str, int]) -> Callable[[], object]:
    def task():
        try:
            socket.create_connection(address, timeout=REACH_TIMEOUT).close()
            return None
        except OSError as exc:
            return f"{type(exc).__name__}: {exc}"
    return task


def _start_hub(token: str, driver_host: str, idle: float,
               ports: Optional[str] = None) -> Callable[[], Tuple[str, int, int, int, str]]:
    def task():
        import subprocess
        import sys

        from duotf._transport.ports import PORTS_ENV

        host = routable_ip(driver_host)  # where the executors reach this one
        env = dict(os.environ, **({PORTS_ENV: ports} if ports else {}))  # the job's range
        proc = subprocess.Popen([sys.executable, "-m", "duotf._transport.relay", host, str(idle)],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=env)
        out, err = proc.communicate(token.encode() + b"\n", timeout=60)
        words = out.decode().split()
        if proc.returncode or words[:1] != [HELLO]:
            raise RuntimeError(f"duotf's relay did not start on {socket.gethostname()} "
                               f"(exit {proc.returncode}): {err.decode()[-2000:]}")
        return host, int(words[1]), int(words[2]), int(words[3]), socket.gethostname()
    return task


class SparkRelay(Route):
    """The route of a Connect client the executors cannot reach: a hub on an executor, a
    :class:`~duotf._transport.relay.Tunnel` here whose polls are Spark jobs."""

    relayed = True

    def __init__(self, client, target: Tuple[str, int], on_lost: Callable[[str], None], idle: float,
                 ports: Optional[str] = None):
        token = secrets.token_hex(16)
        driver_host = client.conf("spark.driver.host") or "127.0.0.1"
        (hub,) = client.spread(_start_hub(token, driver_host, idle, ports), 1)
        host, node_port, poll_port, pid, hostname = hub
        super().__init__((host, node_port))
        self.why = ("DUOTF_RELAY=1 asks for it" if relay_setting()
                    else "the executors cannot open a connection to this process")
        self._client = client
        self._poll_address = (host, poll_port)
        where = f"{hostname} ({host}:{node_port}, pid {pid})"
        logger.info("duotf: the nodes reach this client through a relay on %s", where)
        self.tunnel = Tunnel(self._exchange, target, token, lost_after=idle, on_lost=on_lost,
                             where=where).start()

    def _exchange(self, request: bytes) -> bytes:
        address, timeout = self._poll_address, 30.0

        def run(batches):
            import pyarrow as pa

            for _ in batches:
                pass
            yield pa.RecordBatch.from_pydict({"v": [exchange_with_hub(address, request, timeout)]})

        return self._client.spark.range(0, 1, 1, 1).mapInArrow(run, "v binary").collect()[0].v

    def clock(self) -> float:
        return self.tunnel.clock()

    def run(self, call):
        (value,) = self._client.spread(call, 1)
        return value

    def close(self) -> None:
        self.tunnel.close()
