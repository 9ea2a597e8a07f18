"""The shared suite's test_lifecycle, on every engine of tests/engines.py."""

from duotf.testing.suite.test_lifecycle import *  # noqa: F401,F403
