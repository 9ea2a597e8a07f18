"""The shared suite's test_restarts, on every engine of tests/engines.py."""

from duotf.testing.suite.test_restarts import *  # noqa: F401,F403
