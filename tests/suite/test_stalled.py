"""The shared suite's test_stalled, on every engine of tests/engines.py."""

from duotf.testing.suite.test_stalled import *  # noqa: F401,F403
