"""The shared suite's test_determinism, on every engine of tests/engines.py."""

from duotf.testing.suite.test_determinism import *  # noqa: F401,F403
