"""The shared suite's test_failures, on every engine of tests/engines.py."""

from duotf.testing.suite.test_failures import *  # noqa: F401,F403
