"""Quiet by default, useful when asked: what duotf lets through to the person on the driver.

By default (``verbose`` off):

* the nodes' TensorFlow C++ INFO notes are hidden (``TF_CPP_MIN_LOG_LEVEL=1`` on each node
  unless the job's ``env`` or the executor's environment sets it; warnings still show);
* the known notices of the engines that say nothing about the user's job are filtered on the
  driver when duotf first uses that engine (:data:`KNOWN_NOTICES`: pyspark 4's FutureWarning
  about pandas 3, which Spark's pandas and Arrow functions raise on every DataFrame feed);
* on the nodes, TensorFlow's lines written before it reads that level (absl's preamble, the
  oneDNN note), its warning on every generator dataset and Keras's warnings on every ``fit`` of
  a feed's dataset are hidden (see :mod:`duotf._node.output`); the balanced plan's left-over
  rows are logged at DEBUG; a Spark session duotf makes draws no console progress bar when
  stderr is not a terminal;
* duotf's own log records (``duotf.*``: the lifecycle at INFO) go only where the user's logging
  configuration sends them. The nodes' own output is not duotf's: it is shown, prefixed, where
  no handler of the user's shows the ``duotf.node`` records (see :mod:`duotf._driver.nodelogs`).

:func:`set_verbose` (or ``duotf.run(..., verbose=True)``) turns all of it on for the rest of
the process: the filters are taken out, ``duotf.run`` gives the nodes
``TF_CPP_MIN_LOG_LEVEL=0`` and ``DUOTF_VERBOSE=1``, and duotf's records at INFO and above are
written to stderr where no handler of the user's would show them.
"""

from __future__ import annotations

import logging
import re
import sys
import threading
import warnings

#: (category, start of the message) of the notices filtered when not verbose.
KNOWN_NOTICES = (
    (FutureWarning, "PySpark does not yet fully support pandas"),
)

_lock = threading.Lock()
_verbose = False
_handler = None
_level_before = logging.NOTSET


def is_verbose() -> bool:
    return _verbose


def _ours(entry) -> bool:
    action, message, category, _, _ = entry
    return action == "ignore" and message is not None and any(
        category is cat and message.pattern == re.escape(text) for cat, text in KNOWN_NOTICES)


def quiet_known_notices() -> None:
    """Filter :data:`KNOWN_NOTICES` (once: a filter already there is not added again), unless
    verbose. An engine's backend calls it when duotf first uses the engine."""
    with _lock:
        if _verbose:
            return
        present = [entry for entry in warnings.filters if _ours(entry)]
        for category, text in KNOWN_NOTICES:
            if not any(entry[2] is category and entry[1] is not None
                       and entry[1].pattern == re.escape(text)
                       for entry in present):
                warnings.filterwarnings("ignore", message=re.escape(text), category=category)


class _Stderr(logging.Handler):
    """duotf's records on the ``sys.stderr`` of the moment; a node's line is left to
    :mod:`duotf._driver.nodelogs`, which writes it where no handler of the user's shows it."""

    duotf_own = True  # not a handler of the user's (nodelogs asks)

    def __init__(self):
        super().__init__(logging.INFO)
        self.setFormatter(logging.Formatter("%(message)s"))

    def filter(self, record: logging.LogRecord) -> bool:
        if hasattr(record, "duotf_node"):
            return False
        return super().filter(record)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            sys.stderr.write(self.format(record) + "\n")
        except Exception:
            self.handleError(record)


def set_verbose(on: bool = True) -> None:
    """Show (``True``) or hide (``False``) what duotf hides by default, from now on in this
    process (see the module's notes)."""
    global _verbose, _handler, _level_before
    with _lock:
        _verbose = bool(on)
        log = logging.getLogger("duotf")
        if on:
            # typeshed types warnings.filters as a Sequence; it is the module's list
            warnings.filters[:] = [  # type: ignore[index]
                entry for entry in warnings.filters if not _ours(entry)]
            if _handler is None and not log.hasHandlers():
                _handler, _level_before = _Stderr(), log.level
                log.addHandler(_handler)
                if log.getEffectiveLevel() > logging.INFO:
                    log.setLevel(logging.INFO)
        elif _handler is not None:
            log.removeHandler(_handler)
            log.setLevel(_level_before)
            _handler = None
    if not on:
        quiet_known_notices()


def node_env(env: dict) -> dict:
    """The job's ``env`` for the nodes: when verbose, told so (``DUOTF_VERBOSE=1``: nothing of
    theirs hidden, see :mod:`duotf._node.output`) and with the TensorFlow C++ INFO notes shown
    (``TF_CPP_MIN_LOG_LEVEL=0``, unless ``env`` sets it)."""
    if not _verbose:
        return env
    # the name is duotf._node.output.VERBOSE_ENV (a layer above this one)
    return {"TF_CPP_MIN_LOG_LEVEL": "0", **env, "DUOTF_VERBOSE": "1"}
