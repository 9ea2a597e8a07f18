"""The shared suite's test_feed_memory, on every engine of tests/engines.py."""

from duotf.testing.suite.test_feed_memory import *  # noqa: F401,F403
