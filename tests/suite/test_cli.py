"""The shared suite's test_cli, on every engine of tests/engines.py."""

from duotf.testing.suite.test_cli import *  # noqa: F401,F403
