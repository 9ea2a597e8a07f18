"""The shared suite's test_feed_schema, on every engine of tests/engines.py."""

from duotf.testing.suite.test_feed_schema import *  # noqa: F401,F403
