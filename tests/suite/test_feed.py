"""The shared suite's test_feed, on every engine of tests/engines.py."""

from duotf.testing.suite.test_feed import *  # noqa: F401,F403
