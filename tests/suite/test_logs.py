"""The shared suite's test_logs, on every engine of tests/engines.py."""

from duotf.testing.suite.test_logs import *  # noqa: F401,F403
