"""The shared suite's test_keras, on every engine of tests/engines.py."""

from duotf.testing.suite.test_keras import *  # noqa: F401,F403
