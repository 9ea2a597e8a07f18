"""The shared suite's test_parallel, on every engine of tests/engines.py."""

from duotf.testing.suite.test_parallel import *  # noqa: F401,F403
