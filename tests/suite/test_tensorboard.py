"""The shared suite's test_tensorboard, on every engine of tests/engines.py."""

from duotf.testing.suite.test_tensorboard import *  # noqa: F401,F403
