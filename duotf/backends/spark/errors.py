"""Spark's job errors, read for what they say: the one line that names why, and the task.

A failed Spark job reaches Python as a ``Py4JJavaError`` (classic) or a ``SparkException``
whose text is a Java stack trace around the reason: "An error occurred while calling
o207.collectToPython", the task that was lost ("Lost task 0.3 in stage 7.0 (TID 21) (10.0.0.5
executor 1)"), and, where a Python task raised, its exception inside a ``PythonException``.
The planner (engine-neutral) asks :meth:`SparkFeed.job_error
<duotf.backends.spark.feed.SparkFeed.job_error>` for these; this module is the only place that
reads Spark's text.
"""

from __future__ import annotations

import re
from typing import List, Optional, Tuple

from duotf.backends.base import JobError
from duotf.errors import cause_of

__all__ = ["job_error", "one_line"]

#: a Python exception's line inside a Java trace: "ValueError: ...", "mod.MyError: ...", not
#: a Java, Scala or Py4J class
_PY_ERROR = re.compile(r"^(?!org\.|java\.|py4j\.|scala\.)[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b.*")
_LOST_TASK = re.compile(r"Lost task (\d+)\.(\d+) in stage (\d+)\.(\d+) \(TID (\d+)\) \(([^)]*)\)")
_REASON = "most recent failure:"


def _lines(exc: BaseException) -> List[str]:
    return [line.strip() for line in str(exc).splitlines() if line.strip()]


def _cause(exc: BaseException) -> str:
    """The Python exception that failed the task (the last "...Error: ..." line of its
    PythonException text, in a Py4JJavaError or a PythonException) or Spark's own reason, not
    "An error occurred while calling ..." nor "An exception was thrown from the Python
    worker"."""
    text = str(exc)
    if ("An error occurred while calling" in text or "SparkException" in text
            or "Traceback (most recent call last)" in text):  # a task's Python error, relayed
        lines = _lines(exc)
        python = [line for line in lines if _PY_ERROR.match(line) and not line.startswith("at ")]
        if python:
            return python[-1][:500]
        for line in lines:
            if _REASON in line:
                return line.split(_REASON, 1)[1].strip()[:500]
        for line in lines:
            if "Exception: " in line:
                return line.rsplit("Exception: ", 1)[1].strip()[:500]
    return cause_of(exc)


def _lost_task(text: str) -> Tuple[Optional[int], Optional[str]]:
    """``(partition, description)`` of the task the error names, or ``(None, None)``. The
    partition is the task's index, which is the feed's partition: duotf's feeding and counting
    stages map the data's partitions one to one."""
    found = _LOST_TASK.search(text)
    if not found:
        return None, None
    index, attempt, stage, stage_attempt, tid, where = found.groups()
    return int(index), (f"Spark task {index}.{attempt} of stage {stage}.{stage_attempt} (TID {tid}) "
                        f"on {where}")


def job_error(exc: BaseException) -> JobError:
    """What a failed Spark job's error says: why, and the task (and so the partition) it lost."""
    partition, task = _lost_task(str(exc))
    return JobError(cause=_cause(exc), partition=partition, task=task)


def one_line(exc: BaseException) -> str:
    """An engine error in one line for a log (a Py4JJavaError's text holds a whole Java stack
    trace): Spark's reason where it gives one, else the first line."""
    lines = _lines(exc)
    for line in lines:
        if _REASON in line:
            return line.split(_REASON, 1)[1].strip()[:300]
    return (lines[0] if lines else type(exc).__name__)[:300]
