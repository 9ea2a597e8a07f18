"""The shared suite's test_scoring, on every engine of tests/engines.py."""

from duotf.testing.suite.test_scoring import *  # noqa: F401,F403
