"""The shared suite's test_estimator, on every engine of tests/engines.py."""

from duotf.testing.suite.test_estimator import *  # noqa: F401,F403
