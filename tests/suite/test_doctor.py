"""The shared suite's test_doctor, on every engine of tests/engines.py."""

from duotf.testing.suite.test_doctor import *  # noqa: F401,F403
