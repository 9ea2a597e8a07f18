"""Line coverage of ``duotf/`` in the test process, for CI: ``-p tests.cover`` on pytest's
command line (or in ``PYTEST_ADDOPTS``, so that the README's own command runs as written).

Loaded before any conftest, so it starts measuring before duotf is first imported; each run
saves a data file of its own (``.coverage.*``, or ``$COVERAGE_FILE.*``), and ``python3 -m
coverage combine && python3 -m coverage report`` adds them up. What runs in other processes (node
processes, Spark's and Dask's workers) is not counted: the same measure before and after a
change, and no tracer in the processes whose output and timing the tests check.
"""

import os

import coverage

_cov = coverage.Coverage(data_file=os.environ.get("COVERAGE_FILE", ".coverage"), data_suffix=True,
                         source=["duotf"], config_file=False)
_cov.start()


def pytest_unconfigure(config):
    _cov.stop()
    _cov.save()
