"""The shared suite's test_tls, on every engine of tests/engines.py."""

from duotf.testing.suite.test_tls import *  # noqa: F401,F403
