"""The shared suite's test_orphans, on every engine of tests/engines.py."""

from duotf.testing.suite.test_orphans import *  # noqa: F401,F403
