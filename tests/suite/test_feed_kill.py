"""The shared suite's test_feed_kill, on every engine of tests/engines.py."""

from duotf.testing.suite.test_feed_kill import *  # noqa: F401,F403
