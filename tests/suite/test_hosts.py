"""The shared suite's test_hosts, on the engines of tests/engines.py that run across hosts."""

from duotf.testing.suite.test_hosts import *  # noqa: F401,F403
