"""A real MLflow tracking server for the shared suite's tracking test: ``mlflow server`` on
127.0.0.1, its runs in SQLite and its artifacts served over HTTP (``--serve-artifacts``), in a
folder of the caller's.

The server needs the full ``mlflow`` package, whose pins (pyarrow's, among others) may not suit
the environment under test, which needs only ``mlflow-skinny``: :func:`server_command` takes
the command from ``DUOTF_MLFLOW_SERVER`` (an ``mlflow`` executable, e.g. of a virtual
environment of its own, as .ci/run makes), else runs this Python's ``mlflow`` if it can serve.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import Iterator, List, Optional

__all__ = ["SERVER_ENV", "server_command", "mlflow_server"]

#: the environment variable naming the ``mlflow`` command that serves (a path, with arguments)
SERVER_ENV = "DUOTF_MLFLOW_SERVER"
#: what the server's environment adds: no background job runner (7 processes), no telemetry
_SERVER_ENV = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", "MLFLOW_DISABLE_TELEMETRY": "true"}


def server_command() -> Optional[List[str]]:
    """The ``mlflow`` command that serves: ``DUOTF_MLFLOW_SERVER``, else this Python's
    ``mlflow`` when the full package is installed; None without either."""
    given = os.environ.get(SERVER_ENV)
    if given:
        return shlex.split(given)
    if all(importlib.util.find_spec(name) is not None for name in ("mlflow", "flask", "sqlalchemy",
                                                                    "alembic")):
        return [sys.executable, "-m", "mlflow"]
    return None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=2) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def _stop(proc: subprocess.Popen, grace: float = 10.0) -> None:
    """Stop the server and every process of its group (uvicorn's worker): SIGTERM, then
    SIGKILL to what is left after ``grace`` seconds."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            proc.poll()  # reap the leader: the group is gone once its last process is
            if not _group_alive(proc.pid):
                return
            time.sleep(0.05)


def _group_alive(pgid: int) -> bool:
    """Whether a process of the group ``pgid`` runs (a zombie, which no one may reap here,
    does not count)."""
    import psutil

    for proc in psutil.process_iter(["status"]):
        try:
            if os.getpgid(proc.pid) == pgid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                return True
        except (ProcessLookupError, PermissionError):
            continue
    return False


@contextlib.contextmanager
def mlflow_server(folder: str, command: List[str], timeout: float = 120.0) -> Iterator[str]:
    """Run ``mlflow server`` with its store and artifacts in ``folder``; yield its URL once it
    answers ``/health``; stop it and its workers on the way out, whatever happened.

    Parameters
    ----------
    folder : str
        Where the SQLite store (``mlflow.db``), the artifacts and the server's log go.
    command : list of str
        The ``mlflow`` command (:func:`server_command`).
    timeout : float
        Seconds the server has to answer.
    """
    os.makedirs(folder, exist_ok=True)
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = os.path.join(folder, "server.log")
    args = command + ["server", "--backend-store-uri", "sqlite:///" + os.path.join(folder, "mlflow.db"),
                      "--serve-artifacts", "--artifacts-destination", os.path.join(folder, "artifacts"),
                      "--host", "127.0.0.1", "--port", str(port), "--workers", "1"]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                cwd=folder, env=dict(os.environ, **_SERVER_ENV),
                                start_new_session=True)
    try:
        deadline = time.monotonic() + timeout
        while not _answers(url):
            if proc.poll() is not None or time.monotonic() > deadline:
                with open(log_path, encoding="utf-8", errors="replace") as f:
                    tail = f.read()[-3000:]
                what = (f"exited with {proc.returncode}" if proc.returncode is not None
                        else f"did not answer in {timeout:g} s")
                raise RuntimeError(f"mlflow server ({shlex.join(args)}) {what}:\n{tail}")
            time.sleep(0.1)
        yield url
    finally:
        _stop(proc)
