"""The shared suite's test_metrics, on every engine of tests/engines.py."""

from duotf.testing.suite.test_metrics import *  # noqa: F401,F403
