"""The shared suite's test_keras_predict, on every engine of tests/engines.py."""

from duotf.testing.suite.test_keras_predict import *  # noqa: F401,F403
