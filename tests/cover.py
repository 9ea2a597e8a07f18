"""Line coverage of ``duotf/`` in the test process, for CI: ``-p tests.cover`` on pytest's
command line (or in ``PYTEST_ADDOPTS``, so that the README's own command runs as written).

Loaded before any conftest, so it starts measuring before duotf is first imported; each run
saves a data file of its own (``.coverage.*``, or ``$COVERAGE_FILE.*``), and ``python3 -m
coverage combine && python3 -m coverage report`` adds them up. Of the other processes, only the
warm node servers are measured (``tests/cover_site/sitecustomize.py``: code that runs nowhere
else); the nodes, Spark's and Dask's workers and the rest are not: the same measure before and
after a change, and no tracer in the processes whose output and timing the tests check.
"""

import os

import coverage
import pytest

_SITE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cover_site")
os.environ["COVERAGE_FILE"] = os.path.abspath(os.environ.get("COVERAGE_FILE", ".coverage"))
if _SITE not in os.environ.get("PYTHONPATH", "").split(os.pathsep):  # (an xdist worker has it)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (_SITE, os.environ.get("PYTHONPATH")) if p)

_cov = coverage.Coverage(data_file=os.environ["COVERAGE_FILE"], data_suffix=True,
                         source=["duotf"], config_file=False)
_cov.start()


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session):
    """Saved at the session's end, not at unconfigure: a pytest-xdist worker is ended by its
    controller once it reports its session finished, which is after this hook and before its
    unconfigure would run."""
    _cov.stop()
    _cov.save()
