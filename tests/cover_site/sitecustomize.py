"""Loaded by every Python process that the suite starts while ``-p tests.cover`` measures line
coverage (``tests/cover.py`` puts this folder first on ``PYTHONPATH``); it measures one kind of
them: the warm node servers (``python -m duotf._node.warm_server``).

A server runs code of duotf's own that no other process runs (the fork of a node, the import on a
thread of low priority, the requests of agents) and ends with ``os._exit``: its data is saved
there, into a file of its own beside the test processes' (``$COVERAGE_FILE.*``). A node it forks
is measured while it sets itself up, and no further: no node is (tests/cover.py says why), so
the tracer stops, and the child saves what it measured, where it starts the node's own run.
Every other process is left as it is, then the next ``sitecustomize`` on the path is loaded (that
of ``--timings``, when both are on).
"""

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))


def _measure_warm_server() -> None:
    import coverage

    cov = coverage.Coverage(data_file=os.environ["COVERAGE_FILE"], data_suffix=True,
                            source_pkgs=["duotf"], config_file=False)
    cov.start()
    server = os.getpid()
    exit_now = os._exit

    def _exit(code):
        if os.getpid() == server:
            cov.stop()
            cov.save()
        exit_now(code)

    def in_child():
        child = sys.modules.get("duotf._node.child")
        if child is None:  # not a node's fork
            cov.stop()
            return
        run = child.run

        def measured_until_run(argv):
            cov.stop()
            cov.save()
            return run(argv)

        child.run = measured_until_run

    os._exit = _exit
    os.register_at_fork(after_in_child=in_child)


def _load_next() -> None:
    """The ``sitecustomize`` that this one hides, if any."""
    from importlib.machinery import PathFinder

    spec = PathFinder.find_spec("sitecustomize", [p for p in sys.path if os.path.abspath(p or ".") != _HERE])
    if spec is not None and spec.loader is not None:
        module = type(sys)("sitecustomize")
        module.__file__ = spec.origin
        spec.loader.exec_module(module)


if "duotf._node.warm_server" in (getattr(sys, "orig_argv", None) or sys.argv) and os.environ.get("COVERAGE_FILE"):
    _measure_warm_server()
_load_next()
