"""The shared suite's test_gpus, on every engine of tests/engines.py."""

from duotf.testing.suite.test_gpus import *  # noqa: F401,F403
