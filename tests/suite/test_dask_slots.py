"""The shared suite's test_dask_slots, on every engine of tests/engines.py."""

from duotf.testing.suite.test_dask_slots import *  # noqa: F401,F403
