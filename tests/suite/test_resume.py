"""The shared suite's test_resume, on every engine of tests/engines.py."""

from duotf.testing.suite.test_resume import *  # noqa: F401,F403
