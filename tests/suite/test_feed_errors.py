"""The shared suite's test_feed_errors, on every engine of tests/engines.py."""

from duotf.testing.suite.test_feed_errors import *  # noqa: F401,F403
