"""One node agent against a stand-in driver, in the test process: for the agent and node
process tests, which need neither an engine nor a whole cluster."""

from __future__ import annotations

import queue
import threading

from duotf._node import agent as node
from duotf._node import job as job_payload
from duotf._transport import rendezvous
from duotf._transport.rendezvous import Msg
from tests.conftest import SECRET


def node_job(workdir, address=("127.0.0.1", 1), secret: bytes = SECRET,
             payload: bytes = None) -> node.NodeJob:
    """A job for node 0, whose ``main`` is ``payload`` (default: never run)."""
    return node.NodeJob(
        job_id="test", driver_address=tuple(address), secret=secret,
        payload=payload or job_payload.dumps((print, None)), protocol="grpc",
        heartbeat_interval=0.2, heartbeat_timeout=30, connect_timeout=10, env={},
        default_fs="file://", workdir_root=str(workdir),
    )


class FakeDriver:
    """The driver's end of the rendezvous: a real server whose messages land in a queue."""

    def __init__(self):
        self.secret = rendezvous.new_secret()
        self.messages: "queue.Queue" = queue.Queue()
        self.server = rendezvous.RendezvousServer(
            self.secret, lambda peer, message: self.messages.put((peer, message)), lambda peer, exc: None
        )

    def job(self, workdir) -> node.NodeJob:
        return node_job(workdir, self.server.address, self.secret)

    def expect(self, type_: Msg, timeout: float = 60):
        """``(peer, message)`` of the next message of ``type_``; earlier ones are passed over."""
        while True:
            peer, message = self.messages.get(timeout=timeout)
            if message["type"] == type_:
                return peer, message

    def close(self) -> None:
        self.server.close()


class AgentRun:
    """``_Agent.run()`` on a thread of the test's own; ``outcome`` once it returned."""

    def __init__(self, job: node.NodeJob):
        self.agent = node._Agent(job, 0, "", 0)
        self.outcome = None
        self.thread = threading.Thread(target=self._run, name="test-agent")
        self.thread.start()

    def _run(self) -> None:
        self.outcome = self.agent.run()

    def join(self, timeout: float) -> bool:
        """Whether the agent returned within ``timeout`` seconds."""
        self.thread.join(timeout)
        return not self.thread.is_alive()
