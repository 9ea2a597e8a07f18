"""The temp folders of a driver that died: removed by the next duotf run on its host.

A driver makes folders of its job in the temp folder (its node logs ``duotf-logs-<job>-...``,
the checkpoints of its restarts ``duotf-<job>-checkpoints``, and on the local engine its nodes'
working directories ``duotf-<job>``) and removes them when its ``Cluster`` ends. A driver killed
by SIGKILL or the kernel's OOM killer cannot. So while a job's folders may exist, its driver
holds an exclusive ``flock`` on ``<tmp>/duotf-<job>.lock``; the kernel lets go of it when the
process ends, however it ends. Each new ``Cluster`` then sweeps its temp folder: a lock file it
can lock belongs to a dead driver, and that job's folders go with it. A live driver's lock
cannot be taken (not even by another thread of the same process: a ``flock`` belongs to the
open file), so no live run's folder is touched; a folder without a lock file (another
program's, or an older duotf's) is left alone. Where ``fcntl`` is missing (Windows) nothing is
locked or swept.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import tempfile
import threading
from typing import List, Optional

__all__ = ["JobLock", "sweep"]

logger = logging.getLogger(__name__)

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

_LOCK = re.compile(r"duotf-([0-9a-f]{12})\.lock")


def _lock_path(root: str, job_id: str) -> str:
    return os.path.join(root, f"duotf-{job_id}.lock")


class JobLock:
    """The lock a live driver holds for ``job_id`` (see the module docstring); :meth:`release`
    once the job's folders are gone (idempotent)."""

    def __init__(self, job_id: str, root: Optional[str] = None):
        self.path = _lock_path(root or tempfile.gettempdir(), job_id)
        self._fd: Optional[int] = None
        if fcntl is None:
            return
        # made and locked under another name, then linked to its own (which must be free): a
        # sweep never finds it unlocked
        new = f"{self.path}.{os.getpid()}-{threading.get_ident()}.new"
        fd = os.open(new, os.O_CREAT | os.O_EXCL | os.O_RDWR | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.link(new, self.path)
        except OSError:
            os.close(fd)
            raise
        finally:
            with contextlib.suppress(OSError):
                os.unlink(new)
        os.write(fd, f"{os.getpid()}\n".encode())  # for a person who looks; the lock decides
        self._fd = fd

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:  # the file first: a sweep that finds no file leaves the folders to their owner
            os.unlink(self.path)
        except OSError:
            pass
        os.close(fd)


def _job_entries(root: str, job_id: str) -> List[str]:
    """The entries of ``root`` that job ``job_id``'s driver makes (its attempts' too)."""
    own = re.compile(rf"duotf-({job_id}(-\d+)?(-checkpoints)?|logs-{job_id}-.+)")
    return [os.path.join(root, name) for name in os.listdir(root) if own.fullmatch(name)]


def sweep(root: Optional[str] = None) -> List[str]:
    """Remove the folders of the jobs in ``root`` (the temp folder) whose driver is dead;
    returns what was removed, and says so at INFO."""
    if fcntl is None:
        return []
    root = root or tempfile.gettempdir()
    try:
        names = os.listdir(root)
    except OSError:
        return []
    removed: List[str] = []
    for name in names:
        match = _LOCK.fullmatch(name)
        if match is None:
            continue
        path = os.path.join(root, name)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        except OSError:  # gone meanwhile: its owner released it
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue  # held: a live driver's
            entries = _job_entries(root, match.group(1))
            for entry in entries:
                shutil.rmtree(entry, ignore_errors=True)
            removed += entries
            try:
                os.unlink(path)
            except OSError:
                pass
        finally:
            os.close(fd)
    if removed:
        logger.info("duotf: removed %d folder(s) left in %s by duotf drivers that ended without "
                    "cleaning up (killed, or out of memory): %s", len(removed), root,
                    ", ".join(sorted(os.path.basename(p) for p in removed)))
    return removed
