"""The shared suite's test_ports, on every engine of tests/engines.py."""

from duotf.testing.suite.test_ports import *  # noqa: F401,F403
